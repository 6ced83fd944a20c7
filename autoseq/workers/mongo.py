"""Deprecated: moved to `autoseq.stores.mongo.workers`, beside its store (issue 32).

Every name still resolves here for one release, with a ``DeprecationWarning``.
"""

from autoseq.deprecation import moved

__getattr__ = moved("autoseq.workers.mongo", "autoseq.stores.mongo.workers")
