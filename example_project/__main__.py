"""``python -m example_project`` (``make example``): see ``example_project.demo``."""

import sys

from example_project.demo import main

sys.exit(main())
