"""Metrics through prometheus_client.

- Live series of a running process: `WorkerMetrics` (claimed, completed,
  failed, retried and dead tasks per queue; enqueue-to-start wait and run
  time) and `LoaderMetrics` (passes, tasks by outcome, lag).
- The overview's gauges (`rota stats --format prometheus`, the console's
  /metrics and its --metrics-port): `FiguresCollector`, from
  rota.readmodel.figures, in the registry `overview_registry` builds.
- `rota.readmodel.health`: /metrics, /healthz (alive) and /readyz
  (connected and working) for `--metrics-port`.

Per-tenant series are bounded: the first ROTA_METRICS_TENANTS tenants a
process serves get their own label, the rest are summed under "other"; the
overview's gauges name the top tenants by waiting tasks.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from rota.runtime.outage import outages

if TYPE_CHECKING:  # the figures' module reads Redis, which workers never load
    from rota.readmodel.figures import Figures

OTHER = "other"
# Queues named in the console's series (the deepest); the rest are summed as OTHER.
QUEUE_SERIES = 50
# rota_queue_tasks' states, and the figure of each: running and claimed
# (prefetched) as rota.claims tells a queue's claims apart.
_QUEUE_STATES = (
    ("waiting", "waiting"),
    ("running", "running"),
    ("claimed", "prefetched"),
    ("scheduled", "scheduled"),
    ("dead", "dead"),
)
# Seconds: from a few milliseconds (an idle worker woken by NOTIFY) to hours.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


class TenantLabels:
    """A tenant's label value: its name for the first `limit` tenants seen,
    "other" for the rest, so that series stay bounded however many tenants."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        with self._lock:
            if len(self._named) < self.limit:
                self._named.add(tenant)
                return tenant
        return OTHER


def process_registry() -> CollectorRegistry:
    """A registry of its own (several workers may share a process, in tests),
    with the process's CPU, memory and file figures and its loops' outages."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(OutageCollector())
    return registry


class OutageCollector(Collector):
    """Per loop of this process (what it reaches): outages so far, and
    whether its server is unreachable now."""

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counts = CounterMetricFamily(
            "rota_outages", "Outages of a server a loop needs, by loop.", labels=["loop"]
        )
        down = GaugeMetricFamily(
            "rota_outage_active", "1 while the loop's server is unreachable.", labels=["loop"]
        )
        for loop, (count, now) in sorted(outages().items()):
            counts.add_metric([loop], count)
            down.add_metric([loop], 1.0 if now else 0.0)
        yield counts
        yield down


class LoopHistogram(Collector):
    """A histogram by one label, observed by one thread (a worker's claim
    loop, once per task): a bucket found by bisection and two additions,
    where prometheus_client's Histogram takes a label lookup and a lock per
    observation. A scrape may see a sum one observation ahead of the counts."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = tuple(buckets)
        self._edges = [str(float(b)) for b in self.bounds] + ["+Inf"]  # as Histogram writes them
        # label value -> [count per bucket (the last: above every bound), sum]
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        registry.register(self)

    def observe(self, value: str, amount: float) -> None:
        series = self._series.get(value)
        if series is None:
            series = self._series[value] = ([0] * (len(self.bounds) + 1), [0.0])
        series[0][bisect_left(self.bounds, amount)] += 1
        series[1][0] += amount

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, (counts, total) in list(self._series.items()):
            cumulative = accumulate(list(counts))
            family.add_metric([value], list(zip(self._edges, cumulative, strict=True)), total[0])
        yield family


class LoopCounter(Collector):
    """A counter by (queue, tenant), counted by one thread (a worker's claim
    loop, once per claim's outcomes): a dict addition, where
    prometheus_client's Counter takes a label lookup and a lock."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._counts: dict[tuple[str, str], int] = {}
        registry.register(self)

    def inc(self, queue: str, tenant: str, amount: int) -> None:
        key = (queue, tenant)
        self._counts[key] = self._counts.get(key, 0) + amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["queue", "tenant"])
        for labels, count in list(self._counts.items()):
            family.add_metric(list(labels), count)
        yield family


class WorkerMetrics:
    def __init__(self, tenant_limit: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or process_registry()
        self.tenant = TenantLabels(tenant_limit)
        self.claimed = Counter("rota_tasks_claimed", "Tasks claimed.", ["queue"], registry=registry)
        self.completed = LoopCounter("rota_tasks_completed", "Tasks that succeeded.", registry)
        self.failed = LoopCounter("rota_tasks_failed", "Failed attempts.", registry)
        self.retried = Counter(
            "rota_tasks_retried", "Failed attempts to be retried.", ["queue"], registry=registry
        )
        self.dead = Counter(
            "rota_tasks_dead",
            "Tasks dead (or cancelled) after failing.",
            ["queue"],
            registry=registry,
        )
        self.wait = LoopHistogram(
            "rota_task_wait_seconds",
            "From enqueue to the start of the attempt.",
            "queue",
            WAIT_BUCKETS,
            registry,
        )
        self.run = LoopHistogram(
            "rota_task_run_seconds", "Run time of an attempt.", "queue", RUN_BUCKETS, registry
        )

    def attempts(self, ended: Iterable[tuple[str, str, float, float, bool]]) -> None:
        """Attempts that ran, as (queue, tenant, waited, ran, failed), from the
        claim loop alone (the Loop* collectors take no lock)."""
        tenant_label = self.tenant
        for queue, tenant, waited, ran, failed in ended:
            self.wait.observe(queue, waited)
            self.run.observe(queue, ran)
            (self.failed if failed else self.completed).inc(queue, tenant_label(tenant), 1)

    def failure_ended(self, queue: str, retried: bool) -> None:
        (self.retried if retried else self.dead).labels(queue).inc()


class LoaderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or process_registry()
        self.passes = Counter("rota_loader_passes", "Loader passes.", registry=registry)
        self.tasks = Counter(
            "rota_loader_tasks",
            "Tasks by what loading did with them.",
            ["outcome"],
            registry=registry,
        )
        self.lag = Gauge(
            "rota_loader_lag_seconds",
            "Age of the oldest buffer entry the last pass read (0 when it read none).",
            registry=registry,
        )
        self.last_pass = float("-inf")  # monotonic time of the last pass that went through
        self.stalled_after = 60.0

    def passed(self, loaded: int, duplicates: int, dead_lettered: int, lag: float) -> None:
        """A pass (or a Spark micro-batch) went through."""
        self.passes.inc()
        self.tasks.labels("loaded").inc(loaded)
        self.tasks.labels("duplicate").inc(duplicates)
        self.tasks.labels("dead_lettered").inc(dead_lettered)
        self.lag.set(lag)
        self.last_pass = time.monotonic()

    def ready(self) -> bool:
        """A pass went through lately (for /readyz)."""
        return time.monotonic() - self.last_pass < self.stalled_after


class FiguresCollector(Collector):
    """The overview (rota.readmodel.figures) as gauges, read when scraped."""

    def __init__(self, read: Callable[[], Figures]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures = self.read()
        queue_tasks = GaugeMetricFamily(
            "rota_queue_tasks",
            "Tasks by queue and state (running: claims running, at most each worker's"
            " concurrency; claimed: claimed, not started).",
            labels=["queue", "state"],
        )
        throughput = GaugeMetricFamily(
            "rota_queue_completed_per_minute",
            "Completions per minute (last 5 minutes).",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "rota_queue_oldest_wait_seconds", "Wait of the oldest task in line.", labels=["queue"]
        )
        # The deepest queues by name, the rest summed as 'other': any producer
        # may make a queue (without ROTA_QUEUES), and a series each would
        # have no bound.
        deepest = sorted(figures.queues, key=lambda q: -(q.waiting + q.running + q.prefetched))
        shown, rest = deepest[:QUEUE_SERIES], deepest[QUEUE_SERIES:]
        for q in shown:
            for state, field in _QUEUE_STATES:
                queue_tasks.add_metric([q.name, state], getattr(q, field))
            throughput.add_metric([q.name], q.per_minute)
            if q.oldest_wait_seconds is not None:
                oldest.add_metric([q.name], q.oldest_wait_seconds)
        if rest:
            for state, field in _QUEUE_STATES:
                queue_tasks.add_metric([OTHER, state], sum(getattr(q, field) for q in rest))
            throughput.add_metric([OTHER], sum(q.per_minute for q in rest))
        tenant_tasks = GaugeMetricFamily(
            "rota_tenant_tasks",
            "Top tenants' tasks by state (the rest under 'other').",
            labels=["tenant", "state"],
        )
        named = {"waiting": 0, "running": 0}
        for t in figures.tenants:
            for state in named:
                tenant_tasks.add_metric([t.name, state], getattr(t, state))
                named[state] += getattr(t, state)
        for state in named:
            total = sum(getattr(q, state) for q in figures.queues)
            tenant_tasks.add_metric([OTHER, state], max(0, total - named[state]))
        # The top tenants' figures per minute over the fair share's window
        # (rota.core.history.FairShare: the console's and `rota tenant`'s).
        served = GaugeMetricFamily(
            "rota_tenant_served_per_minute",
            "Top tenants' completions per minute over the last whole minutes.",
            labels=["tenant"],
        )
        demand = GaugeMetricFamily(
            "rota_tenant_demand_per_minute",
            "Top tenants' demand per minute (completed, or unfinished at the window's end).",
            labels=["tenant"],
        )
        fair = GaugeMetricFamily(
            "rota_tenant_fair_share_per_minute",
            "Top tenants' max-min fair share per minute (equal to served when within rounding).",
            labels=["tenant"],
        )
        for name, share in sorted(figures.fair.items()):
            served.add_metric([name], share.served_per_minute)
            demand.add_metric([name], share.demand_per_minute)
            if share.fair_share_per_minute is not None:
                fair.add_metric([name], share.fair_share_per_minute)
        # Claims split as rota.claims tells them apart (rota.stats counts them).
        started = GaugeMetricFamily(
            "rota_tasks_running",
            "Claimed tasks running: at most each worker's concurrency.",
        )
        started.add_metric([], sum(q.running for q in figures.queues))
        prefetched = GaugeMetricFamily(
            "rota_tasks_claimed_not_started",
            "Claimed tasks not started (prefetched beyond a worker's concurrency).",
        )
        prefetched.add_metric([], sum(q.prefetched for q in figures.queues))
        workers = GaugeMetricFamily("rota_workers", "Live workers.")
        workers.add_metric([], len(figures.workers))
        buffer = GaugeMetricFamily(
            "rota_buffer_entries", "Entries in a buffer shard not yet loaded.", labels=["shard"]
        )
        buffer_age = GaugeMetricFamily(
            "rota_buffer_oldest_age_seconds", "Age of a shard's oldest entry.", labels=["shard"]
        )
        for shard, values in figures.buffer.items():
            buffer.add_metric([shard], values.get("entries", 0))
            if "oldest_age_seconds" in values:
                buffer_age.add_metric([shard], values["oldest_age_seconds"])
        letters = GaugeMetricFamily("rota_dead_letters", "Entries in the dead-letter stream.")
        if figures.dead_letters is not None:
            letters.add_metric([], figures.dead_letters)
        up = GaugeMetricFamily("rota_server_up", "Whether a server answered.", labels=["server"])
        for server in ("postgresql", "redis"):
            up.add_metric([server], 0 if server in figures.unavailable else 1)
        yield from (
            queue_tasks,
            throughput,
            oldest,
            tenant_tasks,
            served,
            demand,
            fair,
            workers,
            started,
            prefetched,
            buffer,
            buffer_age,
            letters,
            up,
        )


def overview_registry(read: Callable[[], Figures], *, process: bool) -> CollectorRegistry:
    """The registry of the overview's gauges, each scrape calling `read`;
    with `process`, the process's own CPU, memory and file figures too (a
    server's /metrics; not a one-off `rota stats`)."""
    registry = process_registry() if process else CollectorRegistry()
    registry.register(FiguresCollector(read))
    return registry


def figures_text(figures: Figures) -> str:
    """The overview in the Prometheus text format."""
    return generate_latest(overview_registry(lambda: figures, process=False)).decode()
