"""The overview's gauges in the Prometheus text format, as a scraper reads them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rota.core.read import QueueRow, TopTenant
from rota.readmodel.figures import Figures
from rota.readmodel.metrics import figures_text


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


def test_the_claim_loops_histogram_reads_as_prometheus_clients_own() -> None:
    """LoopHistogram (no lock or label lookup per task) exposes exactly what a
    prometheus_client Histogram fed the same observations does."""
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from rota.readmodel.metrics import WAIT_BUCKETS, LoopHistogram

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("w_seconds", "Wait.", ["queue"], buckets=WAIT_BUCKETS, registry=theirs)
    loop = LoopHistogram("w_seconds", "Wait.", "queue", WAIT_BUCKETS, ours)
    rng = random.Random(7)
    values = [0.0, 0.005, 0.0050001, 3600.0, 4000.0] + [rng.expovariate(2.0) for _ in range(500)]
    for i, value in enumerate(values):
        queue = ("pdfs", "mail")[i % 2]
        reference.labels(queue).observe(value)
        loop.observe(queue, value)

    def histogram_lines(registry: CollectorRegistry) -> set[str]:
        text = generate_latest(registry).decode()
        return {
            line
            for line in text.splitlines()
            if line.startswith("w_seconds_") and not line.startswith("w_seconds_created")
        }

    assert histogram_lines(ours) == histogram_lines(theirs)


def _counted(registry: Any, name: str) -> dict[tuple[str, str], float]:
    """A counter's exposed `_total` samples, by (queue, tenant)."""
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {
        (s.labels["queue"], s.labels["tenant"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == f"{name}_total"
    }


def test_tenants_past_the_limit_share_one_series() -> None:
    from rota.consumer.running import Attempt
    from rota.readmodel.metrics import WorkerMetrics

    metrics = WorkerMetrics(tenant_limit=2)
    for first in range(0, 50, 10):  # as the claim loop collects them, a few at a time
        metrics.attempts(
            Attempt("q", f"tenant-{i}", 0.01, 0.001, False) for i in range(first, first + 10)
        )
    completed = _counted(metrics.registry, "rota_tasks_completed")
    assert completed == {("q", "tenant-0"): 1, ("q", "tenant-1"): 1, ("q", "other"): 48}


def test_the_claim_loops_counter_reads_as_prometheus_clients_own() -> None:
    """LoopCounter (no lock or label lookup per task) exposes the samples a
    prometheus_client Counter fed the same counts does."""
    from prometheus_client import CollectorRegistry, Counter

    from rota.readmodel.metrics import LoopCounter

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("t_done", "Done.", ["queue", "tenant"], registry=theirs)
    loop = LoopCounter("t_done", "Done.", ours)
    for i in range(300):
        queue, tenant, n = ("pdfs", "mail")[i % 2], f"t{i % 7}", 1 + i % 3
        reference.labels(queue, tenant).inc(n)
        loop.inc(queue, tenant, n)
    assert _counted(ours, "t_done") == _counted(theirs, "t_done")
    assert sum(_counted(ours, "t_done").values()) == sum(1 + i % 3 for i in range(300))


def test_attempts_collected_together_count_each_way_they_ended() -> None:
    from rota.consumer.running import Attempt
    from rota.readmodel.metrics import WorkerMetrics

    metrics = WorkerMetrics(tenant_limit=10)
    metrics.attempts(
        [
            Attempt("q", "a", 0.01, 0.002, False),
            Attempt("q", "a", 0.02, 0.004, True),
            Attempt("q", "a", 0.03, 0.006, False),
            Attempt("r", "b", 0.04, 0.008, False),
        ]
    )
    assert _counted(metrics.registry, "rota_tasks_completed") == {("q", "a"): 2, ("r", "b"): 1}
    assert _counted(metrics.registry, "rota_tasks_failed") == {("q", "a"): 1}
    # Every attempt's wait and run time observed, per queue.
    families = {f.name: f for f in metrics.wait.collect()}
    samples = {
        (s.name, s.labels.get("queue")): s.value
        for s in families["rota_task_wait_seconds"].samples
        if s.name.endswith(("_count", "_sum"))
    }
    assert samples[("rota_task_wait_seconds_count", "q")] == 3
    assert samples[("rota_task_wait_seconds_sum", "q")] == pytest.approx(0.06)
    assert samples[("rota_task_wait_seconds_count", "r")] == 1


def test_queues_past_the_limit_share_one_series() -> None:
    from rota.readmodel.metrics import OTHER, QUEUE_SERIES

    queues = [QueueRow(f"q{i:03d}", False, i, 0, 0, 1, 1.0, None, None) for i in range(80)]
    figures = Figures(
        datetime.now(UTC), queues=queues, tenants=[], buffer={}, dead_letters=0, unavailable={}
    )
    got = samples(figures_text(figures))
    named = {dict(labels)["queue"] for name, labels in got if name == "rota_queue_tasks"}
    assert len(named) == QUEUE_SERIES + 1 and OTHER in named and "q079" in named  # the deepest
    assert "q000" not in named
    rest = sum(range(80 - QUEUE_SERIES))  # the shallowest, waiting 0 .. 29
    assert got[("rota_queue_tasks", (("queue", OTHER), ("state", "waiting")))] == rest
    assert got[("rota_queue_tasks", (("queue", OTHER), ("state", "dead")))] == 80 - QUEUE_SERIES


def test_the_overview_registry_reads_at_each_scrape_and_is_built_in_one_place() -> None:
    from pathlib import Path

    from prometheus_client import generate_latest

    import rota
    from rota.readmodel.metrics import overview_registry

    reads: list[int] = []

    def read() -> Figures:
        reads.append(1)
        return Figures(datetime.now(UTC), dead_letters=len(reads))

    served = overview_registry(read, process=True)
    assert samples(generate_latest(served).decode())[("rota_dead_letters", ())] == 1
    assert samples(generate_latest(served).decode())[("rota_dead_letters", ())] == 2
    assert "process_cpu_seconds_total" in generate_latest(served).decode()
    one_off = generate_latest(overview_registry(read, process=False)).decode()
    assert "process_" not in one_off and "rota_dead_letters" in one_off

    package = Path(rota.__file__).parent
    builders = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "FiguresCollector(" in path.read_text()
    )
    assert builders == ["readmodel/metrics.py"]
