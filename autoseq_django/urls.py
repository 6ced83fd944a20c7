"""``path("autoseq/", include("autoseq_django.urls"))``: ``metrics`` for Prometheus."""

from __future__ import annotations

from django.urls import path

from autoseq_django.metrics import metrics_view

app_name = "autoseq"
urlpatterns = [path("metrics", metrics_view, name="metrics")]
