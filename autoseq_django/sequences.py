"""Deprecated: moved to `autoseq_django.registry`, named as in `autoseq_mongoengine` (issue 32).

Every name still resolves here for one release, with a ``DeprecationWarning``,
so code and old migrations calling ``autoseq_django.sequences.store(...)``
keep working.
"""

from autoseq.deprecation import moved

__getattr__ = moved("autoseq_django.sequences", "autoseq_django.registry")
