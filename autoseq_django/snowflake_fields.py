"""Deprecated: moved to `autoseq_django.snowflake`, named as in `autoseq_mongoengine` (issue 32).

Every name still resolves here for one release, with a ``DeprecationWarning``,
so migrations and settings naming ``autoseq_django.snowflake_fields.SnowflakeField``
keep loading. The fields' ``deconstruct()`` names ``autoseq_django.fields``,
as before: ``makemigrations`` proposes no change.
"""

from autoseq.deprecation import moved

__getattr__ = moved("autoseq_django.snowflake_fields", "autoseq_django.snowflake")
