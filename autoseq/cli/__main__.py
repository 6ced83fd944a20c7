"""``python -m autoseq.cli``."""

import sys

from autoseq.cli import main

sys.exit(main())
