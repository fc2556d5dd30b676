"""Housekeeping the queue needs, as a set of duties, each on its own interval:
promote due tasks, requeue expired leases, reap dead workers, fire cron ticks,
the retention duties (finished and dead tasks, stopped workers' rows, the
loader ledger), and the console's figures (service per minute, counts per
queue and tenant). Run by `rota maintenance`, or inside workers by the one that holds
the maintenance lock (`Leadership`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from croniter import croniter

from rota import core
from rota.core import connections, db, versions
from rota.core.results import prune_results
from rota.errors import ValidationError
from rota.model.envelope import make_envelope, task_id_for_key
from rota.runtime.outage import Kept, Outage, run_rounds
from rota.settings import Settings

if TYPE_CHECKING:
    from rota.app import App

log = logging.getLogger("rota.maintenance")

# Ledger rows each Spark checkpoint keeps whatever their age: a replay only
# ever concerns a checkpoint's latest batches.
LEDGER_ROWS_KEPT = 100


# What may separate this process's clock from PostgreSQL's (retention's bound).
CLOCK_MARGIN_SECONDS = 60.0


@dataclass
class TickResult:
    """What one tick did (zero for duties that were not due)."""

    promoted: int = 0
    expired: int = 0
    reaped_workers: int = 0
    requeued_from_dead: int = 0
    cron_enqueued: int = 0
    service_counted: int = 0
    stats_rows: int = 0
    pruned: dict[str, int] = field(default_factory=dict)


@dataclass
class Duty:
    """One maintenance duty: runs at most every `interval` seconds."""

    name: str
    interval: float
    run: Callable[[psycopg.Connection[Any], TickResult], None]
    last_run: float = float("-inf")

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.interval


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Maintenance:
    def __init__(
        self,
        settings: Settings,
        app: App | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.app = app
        self.host = socket.gethostname()
        self._clock = clock
        # Silence is judged only once this leader has watched for as long as
        # a worker may stay silent (see `took_over`).
        self.judge_silence_after = float("-inf")
        every = settings.maintenance_seconds
        self.duties = [
            Duty("promote", settings.promote_seconds or every, self.promote),
            Duty("expire_leases", settings.expire_leases_seconds or every, self.expire_leases),
            Duty("reap_workers", settings.reap_workers_seconds or every, self.reap_workers),
            Duty("cron", settings.cron_seconds or every, self.cron),
            Duty("prune_finished", settings.retention_seconds, self.prune_finished),
            Duty("prune_dead", settings.retention_seconds, self.prune_dead),
            Duty("prune_workers", settings.retention_seconds, self.prune_workers),
            Duty("prune_loader_ledger", settings.retention_seconds, self.prune_loader_ledger),
            Duty("prune_results", settings.results_prune_seconds, self.prune_results),
            Duty("count_service", settings.stats_seconds, self.count_service),
            Duty("refresh_stats", settings.stats_seconds, self.refresh_stats),
        ]

    def took_over(self) -> None:
        """This process just became the leader (or got its connection back):
        a worker's silence so far may be this process's own outage, so no
        worker is declared dead for being silent until one full
        ROTA_WORKER_DEAD_AFTER_SECONDS has been watched."""
        self.judge_silence_after = self._clock() + self.settings.worker_dead_after_seconds

    def tick(self, conn: psycopg.Connection[Any]) -> TickResult:
        """Runs the duties that are due. A duty that fails is logged and
        tried again at its next interval; the others still run. A lost
        connection stops the tick (the caller reconnects)."""
        result = TickResult()
        now = self._clock()
        for duty in self.duties:
            if not duty.due(now):
                continue
            duty.last_run = now
            try:
                duty.run(conn, result)
            except db.SERVER_LOST:
                # A deadlock or a lock timeout is one too, but the connection
                # (and the lock it holds) is fine: only a lost one stops the
                # tick.
                if conn.closed or conn.broken:
                    raise
                log.exception(
                    "maintenance duty %s failed; next try in %s s", duty.name, duty.interval
                )
            except Exception:
                log.exception(
                    "maintenance duty %s failed; next try in %s s", duty.name, duty.interval
                )
        return result

    # -- the console's figures -------------------------------------------------

    def count_service(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.service_counted = db.run(conn, core.count_service())

    def refresh_stats(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.stats_rows = db.run(conn, core.refresh_stats())

    # -- the queue's duties ----------------------------------------------------

    def promote(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        # One transaction: tasks taken off the schedule are in line, or still
        # scheduled; never neither.
        result.promoted = db.transact(conn, core.promote_due())

    def expire_leases(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.expired = len(db.run(conn, core.requeue_expired()))

    def reap_workers(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        """Declares dead the workers whose pid is gone on this host
        (requeueing their claims) and those silent past
        ROTA_WORKER_DEAD_AFTER_SECONDS (whose claims their leases free); and
        requeues claims left by workers that stopped."""
        judge_silence = self._clock() >= self.judge_silence_after
        live = db.run(conn, core.live_workers())
        gone = [w.id for w in live if w.host == self.host and not _pid_alive(w.pid)]
        silent = [
            w.id
            for w in live
            if judge_silence
            and w.silent_seconds > self.settings.worker_dead_after_seconds
            and w.id not in gone
        ]
        if gone:
            log.warning("declaring dead the worker(s) whose process is gone: %s", ", ".join(gone))
            result.reaped_workers += len(gone)
            result.requeued_from_dead += len(db.transact(conn, core.reap_gone_workers(gone)))
        if silent:
            # What they hold goes back in line as their leases pass.
            log.warning("declaring dead the silent worker(s) %s", ", ".join(silent))
            result.reaped_workers += len(silent)
            result.requeued_from_dead += len(db.transact(conn, core.reap_workers(silent)))
        # A stopped worker reports before it marks itself stopped, and one
        # declared dead learns so at its next heartbeat: claims older than
        # that are leftovers.
        leftovers = db.run(
            conn, core.reap_stopped_workers_claims(2 * self.settings.heartbeat_seconds)
        )
        result.requeued_from_dead += len(leftovers)

    def cron(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.cron_enqueued = self.fire_cron(conn)

    # -- retention -------------------------------------------------------------

    def prune_finished(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        older_than = self._kept_for(conn, self.settings.finished_retention)
        if older_than is not None:
            result.pruned["finished"] = db.run(conn, core.prune_finished(older_than))

    def prune_dead(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        older_than = self._kept_for(conn, self.settings.dead_retention)
        if older_than is not None:
            result.pruned["dead"] = db.run(conn, core.prune_dead(older_than))

    def _kept_for(self, conn: psycopg.Connection[Any], retention: float) -> float | None:
        """How old an ended task must be to go: the retention, or, waiting for
        the archive, at least as old as what it has written (None: it has
        written nothing, so nothing goes). The margin covers the two clocks."""
        if not self.settings.retention_waits_for_archive:
            return retention
        before = db.run(conn, core.archived_before())
        if before is None:
            return None
        archived_age = (datetime.now(UTC) - before).total_seconds() + CLOCK_MARGIN_SECONDS
        return max(retention, archived_age)

    def prune_workers(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.pruned["workers"] = db.run(conn, core.prune_workers(self.settings.worker_retention))

    def prune_loader_ledger(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.pruned["loader_ledger"] = db.run(
            conn,
            core.prune_loader_batches(self.settings.loader_ledger_retention, LEDGER_ROWS_KEPT),
        )

    def prune_results(self, conn: psycopg.Connection[Any], result: TickResult) -> None:
        result.pruned["results"] = db.run(conn, prune_results())

    # -- cron ------------------------------------------------------------------

    def fire_cron(self, conn: psycopg.Connection[Any], now: datetime | None = None) -> int:
        """Enqueues every tick of the last few minutes. Each tick's task id is
        derived from (task, tick), so however many schedulers run, and however
        often they look, a tick is enqueued once."""
        if self.app is None or not self.app.periodics:
            return 0
        now = now or datetime.now(UTC)
        since = now - timedelta(seconds=self.settings.cron_lookback_seconds)
        envelopes = []
        for periodic in self.app.periodics:
            ticks = croniter(periodic.schedule, since)
            while (tick := ticks.get_next(datetime)) <= now:
                key = f"cron:{periodic.task.name}:{tick.isoformat()}"
                envelopes.append(
                    make_envelope(
                        name=periodic.task.name,
                        queue=periodic.task.options.queue,
                        tenant=periodic.tenant,
                        args=[*periodic.args, tick.isoformat()],
                        task_id=task_id_for_key(key, periodic.tenant),
                        max_attempts=periodic.task.options.max_attempts,
                        backoff_base=periodic.task.options.backoff,
                        backoff_max=periodic.task.options.backoff_max,
                    )
                )
        if not envelopes:
            return 0
        return db.transact(conn, core.load(envelopes))


class Leadership:
    """The maintenance lock, held on one connection: while a process holds
    it, it runs the duties; when that connection is lost, so is the lock (the
    server releases it), and it must be won again on a new connection. Two
    leaders at once would need two sessions holding one advisory lock."""

    def __init__(self, duty: Maintenance, holder: str) -> None:
        self.duty = duty
        self.holder = holder
        self.leader = False

    def tick(self, conn: psycopg.Connection[Any]) -> TickResult | None:
        """On the connection that holds (or tries for) the lock."""
        if not self.leader and db.run(conn, core.try_maintenance_lock()):
            self.leader = True
            self.duty.took_over()
            log.info("%s runs the maintenance duties", self.holder)
        return self.duty.tick(conn) if self.leader else None

    def connection_lost(self) -> None:
        if self.leader:
            log.warning("%s lost the maintenance lock with its connection", self.holder)
        self.leader = False


def run_maintenance(settings: Settings, duty: Maintenance, stop: threading.Event) -> None:
    """`rota maintenance`: the duties every ROTA_MAINTENANCE_SECONDS while this
    process leads, riding out database outages, until `stop` is set."""
    leadership = Leadership(duty, f"maintenance {socket.gethostname()}:{os.getpid()}")
    outage = Outage("PostgreSQL (maintenance)", log)
    # The lock lives in a session: never one a transaction pooler shares out
    # (the "maintenance" connection goes to Settings.session_database_url).
    if settings.session_database_url is None:
        raise ValidationError(
            "rota maintenance holds a session-level lock: behind a transaction pooler, "
            "set ROTA_DIRECT_DATABASE_URL to a URL that reaches PostgreSQL directly"
        )
    conn = Kept(lambda: versions.ready(connections.connect(settings, "maintenance")))

    def lead() -> float:
        leadership.tick(conn.get())
        return settings.maintenance_seconds

    def lost(_error: BaseException) -> None:
        conn.drop()
        leadership.connection_lost()

    try:
        run_rounds(
            lead,
            outage,
            db.SERVER_LOST,
            stop,
            lost=lost,
            carry_on="maintenance",
            pause_after_crash=settings.maintenance_seconds,
        )
    finally:
        conn.drop()
