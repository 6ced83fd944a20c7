"""``autoseq.doctor`` for a Django project: the columns come from the models' fields.

``manage.py autoseq doctor`` prints the report; ``manage.py check --deploy
--database default`` runs the same checks and turns each warning and error into a system check
message (``autoseq.W1xx`` / ``autoseq.E1xx``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from autoseq.doctor import WARN_SECONDS, WARN_SHARE, ColumnUse, Report, examine
from autoseq.errors import StoreUnavailable
from autoseq_django import columns
from autoseq_django import registry as sequences
from autoseq_django.columns import sequence_fields, sequence_models
from autoseq_django.databases import url_key

#: The system check id of each doctor check (E for errors, W for warnings).
CHECK_IDS = {
    "behind": 101,
    "invalid_row": 102,
    "values_left": 103,
    "companion": 104,
    "redis_persistence": 105,
    "store": 106,
    "column": 107,
}


def _sequence_names() -> list[str]:
    return sorted(
        {field.sequence_name for model in sequence_models() for field in sequence_fields(model)}
    )


def _columns(sequence_alias: str) -> list[ColumnUse]:
    uses: list[ColumnUse] = []
    for name in _sequence_names():
        try:
            found = columns.columns_of(name, sequence_alias)
        except DatabaseError as exc:
            uses.append(ColumnUse(f"columns of {name}", name, _failing(exc)))
            continue
        several = len({column.database for column in found}) > 1
        for column in found:
            label = f"{column.label} ({column.database})" if several else column.label
            uses.append(ColumnUse(label, name, _constant(column.value)))
    return uses


def _constant(value: int | None) -> Any:
    return lambda: value


def _failing(exc: BaseException) -> Any:
    def read() -> int | None:
        raise StoreUnavailable(f"reading max() failed: {exc}")

    return read


def _rates(sequence_alias: str) -> dict[str, float]:
    """Consumption rates this process has measured (a running server's, in the admin)."""
    stats = sequences.registry(sequence_alias).stats()
    return {
        name: float(item["consumption_rate"])  # type: ignore[arg-type]
        for name, item in stats.items()
        if item.get("consumption_rate")
    }


def report(
    database: str = DEFAULT_DB_ALIAS,
    *,
    sample: float = 0.0,
    warn_share: float = WARN_SHARE,
    warn_seconds: float = WARN_SECONDS,
    names: Iterable[str] | None = None,
) -> Report:
    """The doctor report of the sequences serving rows written to ``database``."""
    sequence_alias = sequences.sequence_database(database)
    store = sequences.store(sequence_alias)
    return examine(
        store,
        _columns(sequence_alias),
        sample=sample,
        rates=_rates(sequence_alias),
        warn_share=warn_share,
        warn_seconds=warn_seconds,
        names=names,
    )


@checks.register(checks.Tags.database, deploy=True)
def check_doctor(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``check --deploy --database D``: the doctor's errors and warnings for D's sequences.

    Like Django's own database checks it runs only for the databases named
    with ``--database`` (``migrate`` names none for deploy checks), so a
    build step without a database still passes ``check --deploy``.
    """
    if databases is None or not _sequence_names():
        return []
    seen: set[str] = set()
    messages: list[checks.CheckMessage] = []
    for alias in databases:
        sequence_alias = sequences.sequence_database(alias)
        key = url_key(sequence_alias)
        if key in seen:
            continue
        seen.add(key)
        for finding in report(alias).findings:
            if finding.level == "ok":
                continue
            number = CHECK_IDS.get(finding.check, 199)
            where = f"sequence {finding.sequence!r}: " if finding.sequence else ""
            text = f"{where}{finding.message} (database {sequence_alias!r})"
            if finding.level == "error":
                messages.append(checks.Error(text, id=f"autoseq.E{number}"))
            else:
                messages.append(checks.Warning(text, id=f"autoseq.W{number}"))
    return messages
