"""``python -m examples.documents [FOLDER]``: run the pipeline end to end."""

import sys

from examples.documents.run import main

sys.exit(main())
