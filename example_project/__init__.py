"""The example: a Django shop whose orders get keys from autoseq, on embedded SQLite.

``python -m example_project`` (``make example``) builds it from scratch in a
temporary directory, inserts orders from several processes through the ORM
and prints what happened. ``python example_project/manage.py runserver``
serves the admin (orders and sequences) on ``example_project/example.db``.
"""
