"""Deprecated: moved to `autoseq.cli.snowflake` (the CLI is a package, issue 32).

Every name still resolves here for one release, with a ``DeprecationWarning``.
"""

from autoseq.deprecation import moved

__getattr__ = moved("autoseq.snowflake_cli", "autoseq.cli.snowflake")
