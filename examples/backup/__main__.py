"""``python -m examples.backup [--workdir DIR]``: run the backup example end to end."""

import sys

from examples.backup.run import main

sys.exit(main())
