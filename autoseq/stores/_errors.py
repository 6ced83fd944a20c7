"""Driver errors turned into autoseq's: one message shape, one context manager, every store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from autoseq.errors import StoreUnavailable

#: ``translate(exc, operation, what, name)``: a store's own wording of a driver error.
Translate = Callable[[BaseException, str, str, "str | None"], StoreUnavailable]


def first_line(exc: BaseException) -> str:
    """The first line of a driver error's text (SQLAlchemy's wrapped ``orig`` if any)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unavailable(
    exc: BaseException, *, operation: str, what: str, where: str, name: str | None, note: str = ""
) -> StoreUnavailable:
    """``StoreUnavailable`` saying ``what`` failed ``where`` and why, the driver error chained."""
    reason = f"{type(exc).__name__}: {first_line(exc)}"
    error = StoreUnavailable(
        f"{what} {where} failed{note}: {reason}", name=name, operation=operation, reason=reason
    )
    error.__cause__ = exc
    return error


@contextmanager
def translating(
    catch: type[BaseException] | tuple[type[BaseException], ...],
    translate: Translate,
    operation: str,
    what: str,
    name: str | None,
) -> Iterator[None]:
    """Raise ``translate(...)`` from any ``catch`` error raised inside; let the rest through."""
    try:
        yield
    except catch as exc:
        raise translate(exc, operation, what, name) from exc
