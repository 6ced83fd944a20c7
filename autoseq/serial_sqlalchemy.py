"""Deprecated: moved into the `autoseq.sqlalchemy` package (issue 32).

Every name still resolves here for one release, with a ``DeprecationWarning``.
"""

from autoseq.deprecation import moved

__getattr__ = moved("autoseq.serial_sqlalchemy", "autoseq.sqlalchemy")
