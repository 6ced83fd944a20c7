"""``python -m autoseq``: the ``autoseq`` command line (an entry point, not the library)."""

import sys

from autoseq.cli import main

sys.exit(main())
