"""Housekeeping the queue needs: promote due tasks, requeue expired leases,
reap dead workers, fire cron ticks. Run by `rota reaper`, or inside workers by
the one that holds the maintenance lock."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from croniter import croniter

from rota import db, ops
from rota.envelope import make_envelope, task_id_for_key
from rota.producer.app import App
from rota.settings import Settings


@dataclass
class TickResult:
    promoted: int = 0
    expired: int = 0
    reaped_workers: int = 0
    requeued_from_dead: int = 0
    cron_enqueued: int = 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Maintenance:
    def __init__(self, settings: Settings, app: App | None = None) -> None:
        self.settings = settings
        self.app = app
        self.host = socket.gethostname()

    def tick(self, conn: psycopg.Connection[Any]) -> TickResult:
        result = TickResult()
        result.promoted = db.run(conn, ops.promote_due())
        result.expired = len(db.run(conn, ops.requeue_expired()))
        dead = [
            w.id
            for w in db.run(conn, ops.live_workers())
            if w.silent_seconds > self.settings.worker_dead_after_seconds
            or (w.host == self.host and not _pid_alive(w.pid))
        ]
        if dead:
            result.reaped_workers = len(dead)
            result.requeued_from_dead = len(db.transact(conn, ops.reap_workers(dead)))
        result.cron_enqueued = self.fire_cron(conn)
        return result

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
        return db.transact(conn, ops.load(envelopes))
