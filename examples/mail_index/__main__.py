"""``python -m examples.mail_index [FOLDER]`` or ``python -m examples.mail_index status JOB_ID``."""

import sys

from examples.mail_index.run import main

sys.exit(main())
