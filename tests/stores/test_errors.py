"""`autoseq.stores._errors`: the one shape every store gives a driver error.

The stores' own tests reach it through real outages; these pin the shape
itself: what failed, where, the driver's first line, the cause chained.
"""

from __future__ import annotations

import pytest
import sqlalchemy.exc

from autoseq.errors import StoreUnavailable
from autoseq.stores._errors import first_line, translating, unavailable


def test_the_message_says_what_failed_where_and_the_drivers_first_line() -> None:
    cause = ConnectionError("connection refused\nis the server running on host 10.0.0.9?")
    error = unavailable(
        cause, operation="reserve", what="reserve", where="on redis://10.0.0.9", name="orders"
    )
    assert str(error) == "reserve on redis://10.0.0.9 failed: ConnectionError: connection refused"
    assert (error.name, error.operation, error.reason) == (
        "orders",
        "reserve",
        "ConnectionError: connection refused",
    )
    assert error.__cause__ is cause


def test_a_wrapped_driver_error_is_read_from_its_original_and_an_empty_one_by_its_type() -> None:
    original = OSError("could not connect to server: Connection refused\n\tIs the server running?")
    wrapped = sqlalchemy.exc.OperationalError("SELECT 1", {}, original)
    assert first_line(wrapped) == "could not connect to server: Connection refused"
    assert first_line(TimeoutError()) == "TimeoutError"


def test_translating_turns_only_the_driver_errors_it_catches() -> None:
    def translate(
        exc: BaseException, operation: str, what: str, name: str | None
    ) -> StoreUnavailable:
        return unavailable(exc, operation=operation, what=what, where="on the test", name=name)

    expected = r"^read on the test failed: OSError: down$"
    with (
        pytest.raises(StoreUnavailable, match=expected) as caught,
        translating(OSError, translate, "read", "read", "orders"),
    ):
        raise OSError("down")
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(KeyError), translating(OSError, translate, "read", "read", "orders"):
        raise KeyError("not a driver error")
