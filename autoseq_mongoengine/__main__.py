"""``python -m autoseq_mongoengine adopt ...``; see `autoseq_mongoengine.cli`."""

from __future__ import annotations

import sys

from autoseq_mongoengine.cli import main

if __name__ == "__main__":
    sys.exit(main())
