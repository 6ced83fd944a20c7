"""``manage.py`` of the switch project."""

from __future__ import annotations

import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    execute_from_command_line(sys.argv)
