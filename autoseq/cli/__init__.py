"""``autoseq``: look after ``sys_sequence`` rows from the command line.

The command line is a package the library never imports: `autoseq.cli.app`
holds the parser, `register`, opening a store from ``--url`` and the
sequence subcommands; `autoseq.cli.snowflake` and `autoseq.cli.doctor`
add theirs (doctor's checks are the library module [`autoseq.doctor`][autoseq.doctor]).
``python -m autoseq.cli`` and the ``autoseq`` console script run `main`.
"""

from __future__ import annotations

from autoseq.cli import doctor as _doctor
from autoseq.cli import snowflake as _snowflake
from autoseq.cli.app import (
    ACCEPTED_URLS,
    COMMANDS,
    CONNECT_TIMEOUT,
    PROG,
    SQL_SCHEMES,
    Command,
    add_change_options,
    add_setting_arguments,
    build_parser,
    column_max,
    given_settings,
    main,
    open_store,
    past,
    register,
    values_left,
)
from autoseq.errors import UsageError

# snowflake ids: `autoseq snowflake decode VALUE`, `autoseq workers`
_snowflake.register_commands(register)
register("doctor", _doctor.HELP, _doctor.run_cli, _doctor.configure_cli)

__all__ = [
    "ACCEPTED_URLS",
    "COMMANDS",
    "CONNECT_TIMEOUT",
    "PROG",
    "SQL_SCHEMES",
    "Command",
    "UsageError",
    "add_change_options",
    "add_setting_arguments",
    "build_parser",
    "column_max",
    "given_settings",
    "main",
    "open_store",
    "past",
    "register",
    "values_left",
]
