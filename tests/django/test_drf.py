"""Django REST framework, with real serializers and APIClient: numbers clients cannot choose.

Non-key ``SequenceField`` and ``SerialField`` columns are read-only in a
``ModelSerializer`` (as ``AutoField`` is) unless the model says
``editable=True``; snowflake ids go out as JSON strings with
``SnowflakeStringsMixin``, which JavaScript reads exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django import forms
from django.db import models
from django.test import override_settings
from django.urls import path
from rest_framework import generics, serializers
from rest_framework.test import APIClient

from autoseq_django.drf import IdString, SnowflakeStringsMixin
from autoseq_django.fields import SequenceField, SerialField, SnowflakeField
from autoseq_django.snowflake import close_generators
from django_tests.testapp.models import Order, Ticket

pytestmark = pytest.mark.django_db


class DrfChosen(models.Model):
    """A model that lets clients choose the number: ``editable=True`` says so."""

    number = SequenceField(sequence="drf_chosen", editable=True)
    code = SerialField("C-{n:04d}", editable=True)

    class Meta:
        app_label = "testapp"


class DrfEvent(models.Model):
    """Snowflake key and a second snowflake column."""

    id = SnowflakeField(primary_key=True)
    ref = SnowflakeField(layout="refs", null=True)

    class Meta:
        app_label = "testapp"


class DrfAttendance(models.Model):
    """A foreign key and a many-to-many to snowflake-keyed rows."""

    event = models.ForeignKey(DrfEvent, on_delete=models.CASCADE, related_name="+")
    others = models.ManyToManyField(DrfEvent, related_name="+")

    class Meta:
        app_label = "testapp"


def serializer_of(model_: type[models.Model], *mixins: type) -> type[Any]:
    class Meta:
        model = model_
        fields = "__all__"

    return type("S", (*mixins, serializers.ModelSerializer), {"Meta": Meta})


OrderSerializer = serializer_of(Order)
TicketSerializer = serializer_of(Ticket)
ChosenSerializer = serializer_of(DrfChosen)
PlainEventSerializer = serializer_of(DrfEvent)
EventSerializer = serializer_of(DrfEvent, SnowflakeStringsMixin)
AttendanceSerializer = serializer_of(DrfAttendance, SnowflakeStringsMixin)


def create_view(serializer: type[Any]) -> Any:
    return generics.ListCreateAPIView.as_view(
        queryset=serializer.Meta.model.objects.all(),
        serializer_class=serializer,
        authentication_classes=[],
        permission_classes=[],
    )


urlpatterns = [
    path("orders/", create_view(OrderSerializer)),
    path("tickets/", create_view(TicketSerializer)),
    path("chosen/", create_view(ChosenSerializer)),
    path("events/", create_view(EventSerializer)),
    path("plain-events/", create_view(PlainEventSerializer)),
    path("attendances/", create_view(AttendanceSerializer)),
]


@pytest.fixture
def client() -> Iterator[APIClient]:
    with override_settings(ROOT_URLCONF=__name__):
        yield APIClient()
    close_generators()


def post(client: APIClient, url: str, data: dict[str, Any]) -> dict[str, Any]:
    response = client.post(url, data, format="json")
    assert response.status_code == 201, response.content
    result: dict[str, Any] = json.loads(response.content)
    return result


def test_a_client_cannot_choose_the_sequence_number(client: APIClient) -> None:
    """POST with ticket_no=5: the row gets the sequence's next number, not 5."""
    assert OrderSerializer().fields["ticket_no"].read_only
    created = post(client, "/orders/", {"note": "x", "ticket_no": 5})
    stored = Order.objects.get(pk=created["id"])
    assert stored.ticket_no != 5
    assert created["ticket_no"] == stored.ticket_no


def test_a_client_cannot_choose_the_serial(client: APIClient) -> None:
    """POST with number="HACK": the serial comes from its sequence."""
    assert TicketSerializer().fields["number"].read_only
    created = post(client, "/tickets/", {"number": "HACK"})
    assert created["number"].startswith("ORD-")
    assert Ticket.objects.get(pk=created["id"]).number == created["number"]


def test_editable_true_lets_the_client_choose(client: APIClient) -> None:
    """A model that says editable=True keeps the inputs: the client's numbers are kept."""
    assert not ChosenSerializer().fields["number"].read_only
    created = post(client, "/chosen/", {"number": 4242, "code": "C-9999"})
    assert (created["number"], created["code"]) == (4242, "C-9999")
    left_out = post(client, "/chosen/", {})
    assert left_out["number"] is not None
    assert left_out["code"].startswith("C-")


def test_forms_leave_sequence_and_serial_columns_out() -> None:
    """A ModelForm with fields="__all__" has no input for them, as for AutoField."""
    order_form = forms.modelform_factory(Order, fields="__all__")
    ticket_form = forms.modelform_factory(Ticket, fields="__all__")
    chosen_form = forms.modelform_factory(DrfChosen, fields="__all__")
    assert set(order_form.base_fields) == {"note"}
    assert set(ticket_form.base_fields) == set()
    assert set(chosen_form.base_fields) == {"number", "code"}


def test_snowflake_ids_lose_precision_as_json_numbers(client: APIClient) -> None:
    """Without the mixin an id above 2**53 goes out as a number a double cannot hold."""
    created = post(client, "/plain-events/", {"ref": 384286390961045504})
    assert isinstance(created["id"], int)
    assert created["id"] > 2**53
    # JavaScript's JSON.parse keeps a double: it cannot tell the next id apart,
    # and prints the shortest decimal that maps back to it.
    assert float(created["ref"]) == float(created["ref"] + 1)
    assert repr(float(created["ref"])) == "3.842863909610455e+17"  # 384286390961045500


def test_snowflake_ids_go_out_as_strings(client: APIClient) -> None:
    """With SnowflakeStringsMixin the key and the column are strings, exact to the digit."""
    created = post(client, "/events/", {"ref": "384286390961045504"})
    assert isinstance(created["id"], str)
    assert int(created["id"]) == DrfEvent.objects.get().pk
    assert created["ref"] == "384286390961045504"
    assert DrfEvent.objects.get().ref == 384286390961045504
    listed = json.loads(client.get("/events/").content)
    assert listed == [created]


def test_keys_to_snowflake_rows_go_out_as_strings(client: APIClient) -> None:
    """Foreign keys and many-to-many links to snowflake rows are strings too, both ways."""
    events = [DrfEvent.objects.create() for _ in range(3)]
    created = post(
        client,
        "/attendances/",
        {"event": str(events[0].pk), "others": [str(events[1].pk), events[2].pk]},
    )
    assert created["event"] == str(events[0].pk)
    assert sorted(created["others"]) == sorted(str(e.pk) for e in events[1:])
    stored = DrfAttendance.objects.get(pk=created["id"])
    assert stored.event_id == events[0].pk
    assert {e.pk for e in stored.others.all()} == {e.pk for e in events[1:]}


def test_id_string_refuses_floats_and_junk() -> None:
    """A float (already rounded) or a non-number is refused with DRF's validation error."""
    field = IdString()
    assert field.to_internal_value("384286390961045504") == 384286390961045504
    for bad in (3.8428639096104550e17, "12x", True):
        with pytest.raises(serializers.ValidationError, match="valid integer id"):
            field.to_internal_value(bad)
