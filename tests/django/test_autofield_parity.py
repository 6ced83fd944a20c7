"""A SequenceField key behaves like AutoField wherever Django looks at it.

Admin inlines, ModelForms, Django REST framework serializers and
``save(update_fields=...)`` treat the key as the database's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from django import forms
from django.contrib.auth.models import User
from django.forms import inlineformset_factory
from django.test import Client, override_settings
from django.urls import reverse

from django_tests.routers import AppTo
from django_tests.testapp.models import Invoice, Order, OrderItem

pytestmark = pytest.mark.autoseq_all_databases


class _FormFields(HTMLParser):
    """The values a browser would submit from the page's main form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {key: value or "" for key, value in attrs}
        name = found.get("name")
        if tag == "input" and name:
            kind = found.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in found:
                    self.data[name] = found.get("value", "on")
            elif kind not in ("submit", "button", "file"):
                self.data[name] = found.get("value", "")
        elif tag == "select" and name:
            self._select = name
            self.data.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in found:
            self.data[self._select] = found.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea] += data


def submitted(page: str) -> dict[str, Any]:
    """What the browser posts back from ``page`` untouched."""
    parser = _FormFields()
    parser.feed(page)
    return {k: v for k, v in parser.data.items() if k != "csrfmiddlewaretoken"}


@pytest.fixture
def admin_on(backend: str) -> Iterator[Client]:
    """A logged-in admin whose orders live in ``backend``."""
    with override_settings(
        DATABASE_ROUTERS=[AppTo("testapp", backend), "autoseq_django.routers.SequenceRouter"]
    ):
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        client = Client()
        client.force_login(user)
        yield client


def change_page(client: Client, order: Order) -> tuple[str, str]:
    url = reverse("admin:testapp_order_change", args=[order.pk])
    response = client.get(url)
    assert response.status_code == 200
    return url, response.content.decode()


def test_inline_save_with_nothing_changed(backend: str, admin_on: Client) -> None:
    """Saving a parent whose inline rows are untouched succeeds and keeps the rows."""
    order = Order.objects.using(backend).create(note="parent")
    items = [OrderItem.objects.using(backend).create(order=order, sku=f"s{i}") for i in range(2)]
    url, page = change_page(admin_on, order)
    assert f'name="items-0-id" value="{items[0].pk}"' in page
    response = admin_on.post(url, {**submitted(page), "_save": "Save"})
    assert response.status_code == 302, "Please correct" in response.content.decode()
    kept = OrderItem.objects.using(backend).filter(order=order).order_by("pk")
    assert [(item.pk, item.sku) for item in kept] == [(item.pk, item.sku) for item in items]


def test_inline_save_adding_rows(backend: str, admin_on: Client) -> None:
    """New inline rows get sequence keys; existing ones keep theirs."""
    order = Order.objects.using(backend).create(note="parent")
    old = OrderItem.objects.using(backend).create(order=order, sku="old")
    url, page = change_page(admin_on, order)
    data = submitted(page)
    data["items-1-sku"] = "new one"
    data["items-TOTAL_FORMS"] = "3"
    data.update({"items-2-sku": "new two", "items-2-order": str(order.pk), "items-2-id": ""})
    response = admin_on.post(url, {**data, "_save": "Save"})
    assert response.status_code == 302, response.content.decode()[:2000]
    rows = list(OrderItem.objects.using(backend).filter(order=order).order_by("pk"))
    assert [item.sku for item in rows] == ["old", "new one", "new two"]
    assert rows[0].pk == old.pk
    assert rows[2].pk == rows[1].pk + 1 > old.pk


def test_inline_formset_renders_the_key_hidden(backend: str) -> None:
    """An inline formset carries the key in a hidden input, like AutoField."""
    order = Order.objects.using(backend).create()
    OrderItem.objects.using(backend).create(order=order, sku="a")
    formset_class = inlineformset_factory(Order, OrderItem, fields=("sku",), extra=0)
    formset = formset_class(instance=order, queryset=OrderItem.objects.using(backend))
    assert formset.forms[0].fields["id"].widget.is_hidden
    assert 'type="hidden" name="items-0-id"' in str(formset.forms[0])


@pytest.mark.django_db
def test_model_form_leaves_the_key_out() -> None:
    """A ModelForm with fields='__all__' has no key field, like AutoField."""

    class InvoiceForm(forms.ModelForm):  # type: ignore[type-arg]
        class Meta:
            model = Invoice
            fields = "__all__"

    assert list(InvoiceForm().fields) == ["amount"]


@pytest.mark.django_db
def test_drf_serializer_maps_the_key_read_only() -> None:
    """A ModelSerializer makes the key read-only: a client cannot choose it."""
    from rest_framework import serializers

    class InvoiceSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
        class Meta:
            model = Invoice
            fields = "__all__"

    serializer = InvoiceSerializer(data={"id": 999_999_999, "amount": 3})
    assert serializer.fields["id"].read_only
    assert serializer.is_valid(), serializer.errors
    invoice = serializer.save()
    assert invoice.pk != 999_999_999
    assert InvoiceSerializer(invoice).data == {"id": invoice.pk, "amount": 3}


def test_update_fields_on_an_unsaved_instance_is_refused(backend: str) -> None:
    """save(update_fields=...) before the first save raises like AutoField; nothing is written."""
    before = Invoice.objects.using(backend).count()
    with pytest.raises(ValueError, match="Cannot force an update in save"):
        Invoice(amount=1).save(using=backend, update_fields=["amount"])
    assert Invoice.objects.using(backend).count() == before
