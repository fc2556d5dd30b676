"""The health server of `--metrics-port`: loopback only without
ROTA_METRICS_TOKEN; with it, /metrics asks for the token and the health
checks do not."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from rota import Settings
from rota.errors import ValidationError
from rota.readmodel.health import serve_health
from rota_tools.devservers import free_port

TOKEN = "metrics-token-0123456"


def test_beyond_loopback_the_metrics_need_a_token() -> None:
    with pytest.raises(ValidationError, match="ROTA_METRICS_TOKEN"):
        serve_health(Settings(), "0.0.0.0", free_port(), lambda: True)


def test_with_a_token_metrics_ask_for_it_and_health_checks_do_not() -> None:
    registry = CollectorRegistry()
    Counter("rota_test_things", "Things.", registry=registry).inc()
    port = free_port()
    server = serve_health(Settings(metrics_token=TOKEN), "127.0.0.1", port, lambda: True, registry)
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert (
            httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        scraped = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert scraped.status_code == 200 and "rota_test_things_total 1.0" in scraped.text
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 200
    finally:
        server.stop()
