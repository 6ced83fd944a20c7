"""The Django metrics endpoint (``autoseq_django.urls``) after real inserts."""

from __future__ import annotations

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from django_tests.testapp.models import Invoice


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/autoseq/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_the_metrics_url_counts_the_values_inserts_used(backend: str) -> None:
    """autoseq/metrics serves the app's metrics; served values grow by the rows inserted."""
    client = Client()
    Invoice.objects.using(backend).create()  # the sequence has a lock from here on
    from autoseq_django import registry as sequences

    store = sequences.store(sequences.sequence_database(backend))
    where = store.url.render_as_string(hide_password=True)
    key = (
        "autoseq_values_served_total",
        (("sequence", "testapp_invoice"), ("store", f"SQLStore {where}")),
    )
    before = scrape(client).get(key, 0.0)
    Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(30)])
    Invoice.objects.using(backend).create()
    samples = scrape(client)
    assert samples[key] - before == 31
    reservations = sum(
        value
        for (name, labels), value in samples.items()
        if name == "autoseq_reservations_total" and ("sequence", "testapp_invoice") in labels
    )
    assert reservations >= 1
