"""The overview's gauges in the Prometheus text format, as a scraper reads them."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from rota.figures import Figures
from rota.metrics import figures_text
from rota.ops.read import QueueRow, TopTenant


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def tenant(name: str, waiting: int, running: int) -> TopTenant:
    return TopTenant(name, False, waiting, running, 0)


def test_the_overview_as_gauges() -> None:
    figures = Figures(
        datetime.now(UTC),
        queues=[QueueRow("pdfs", False, 10, 2, 1, 3, 4.5, 12.0, None)],
        tenants=[tenant('a"b\\c', 7, 1)],
        buffer={"rota:buffer:{0}": {"entries": 5, "pending": 1, "oldest_age_seconds": 2.5}},
        dead_letters=4,
        unavailable={},
    )
    got = samples(figures_text(figures))
    assert got[("rota_queue_tasks", (("queue", "pdfs"), ("state", "waiting")))] == 10
    assert got[("rota_queue_tasks", (("queue", "pdfs"), ("state", "dead")))] == 3
    assert got[("rota_queue_completed_per_minute", (("queue", "pdfs"),))] == 4.5
    assert got[("rota_tenant_tasks", (("state", "waiting"), ("tenant", 'a"b\\c')))] == 7
    # The tenants not named, summed: 10 waiting in all, 7 named.
    assert got[("rota_tenant_tasks", (("state", "waiting"), ("tenant", "other")))] == 3
    assert got[("rota_buffer_entries", (("shard", "rota:buffer:{0}"),))] == 5
    assert got[("rota_dead_letters", ())] == 4
    assert got[("rota_server_up", (("server", "redis"),))] == 1


def test_a_server_down_shows_as_down() -> None:
    figures = Figures(datetime.now(UTC), unavailable={"postgresql": "OperationalError"})
    got = samples(figures_text(figures))
    assert got[("rota_server_up", (("server", "postgresql"),))] == 0
    assert ("rota_dead_letters", ()) not in got
