"""The Prometheus endpoint for a Django project (``pip install 'autoseq[prometheus]'``).

::

    urlpatterns = [..., path("autoseq/", include("autoseq_django.urls"))]

serves ``autoseq/metrics`` from prometheus_client's default registry, where
the app installs autoseq's metrics at start-up; with ``PROMETHEUS_MULTIPROC_DIR``
set (gunicorn), every worker's figures added up. Protect it as you would any
internal endpoint (a middleware, the web server, a separate port).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics of the default registry, in the format the scraper asks for."""
    from prometheus_client.exposition import choose_encoder

    from autoseq import metrics

    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(metrics.scrape_registry()), content_type=content_type)
