"""The queue core's operations, each written once for sync and async use.

Every function returns an operation for `rota.core.db.run` / `rota.core.db.arun`:

    from rota import core
    from rota.core import db

    with db.connect(url) as conn:
        tasks = db.transact(conn, core.claim(["pdfs"], limit=100, worker="w1"))
        db.transact(conn, core.complete([t.token for t in tasks]))

One module per audience, each with its own file of SQL blocks (rota/sql/):
`load` (producers and loaders), `work` (workers), `results` (kept results
and their waiters), `maintain` (the maintenance duties), `admin`
(operators' actions) and `read` and `stored` (the read model). Each reads
its statements' rows by column name (rota.core.rows).
"""

from rota.core.admin import (
    archive_rows,
    archive_span,
    cancel,
    charge_queue,
    configure_tenant,
    patch_tenant,
    pause_queue,
    pause_tenant,
    record,
    record_archive,
    retry,
    retry_dead,
)
from rota.core.copyrows import TASK_COPY_TYPES, task_rows
from rota.core.limits import (
    LimitUsage,
    declare_limits,
    drop_limit,
    limits,
    reset_limit,
    set_limit,
)
from rota.core.load import (
    commit_without_flush,
    count_loader_batch,
    flush_commits,
    load,
    record_loader_batch,
    tenant_backlogs,
)
from rota.core.maintain import (
    PRUNE_BATCH,
    WorkerInfo,
    archived_before,
    count_service,
    live_workers,
    promote_due,
    prune_dead,
    prune_finished,
    prune_loader_batches,
    prune_workers,
    queue_names,
    reap_gone_workers,
    reap_stopped_workers_claims,
    reap_workers,
    refresh_stats,
    requeue_expired,
    requeue_lost,
    try_maintenance_lock,
)
from rota.core.read import TaskState, queue_counts, task_states
from rota.core.work import (
    ClaimedTask,
    FailOutcome,
    Failure,
    RunTimes,
    Settled,
    WorkerKey,
    claim,
    complete,
    complete_and_claim,
    defer_unknown,
    extend_leases,
    fail,
    listen_cancel,
    listen_ready,
    record_run_times,
    register_worker,
    rejoin_worker,
    release,
    stop_worker,
    worker_claims,
    worker_heartbeat,
)

__all__ = [
    "PRUNE_BATCH",
    "TASK_COPY_TYPES",
    "ClaimedTask",
    "FailOutcome",
    "Failure",
    "LimitUsage",
    "RunTimes",
    "Settled",
    "TaskState",
    "WorkerInfo",
    "WorkerKey",
    "archive_rows",
    "archive_span",
    "archived_before",
    "cancel",
    "charge_queue",
    "claim",
    "commit_without_flush",
    "complete",
    "complete_and_claim",
    "configure_tenant",
    "count_loader_batch",
    "count_service",
    "declare_limits",
    "defer_unknown",
    "drop_limit",
    "extend_leases",
    "fail",
    "flush_commits",
    "limits",
    "listen_cancel",
    "listen_ready",
    "live_workers",
    "load",
    "patch_tenant",
    "pause_queue",
    "pause_tenant",
    "promote_due",
    "prune_dead",
    "prune_finished",
    "prune_loader_batches",
    "prune_workers",
    "queue_counts",
    "queue_names",
    "reap_gone_workers",
    "reap_stopped_workers_claims",
    "reap_workers",
    "record",
    "record_archive",
    "record_loader_batch",
    "record_run_times",
    "refresh_stats",
    "register_worker",
    "rejoin_worker",
    "release",
    "requeue_expired",
    "requeue_lost",
    "reset_limit",
    "retry",
    "retry_dead",
    "set_limit",
    "stop_worker",
    "task_rows",
    "task_states",
    "tenant_backlogs",
    "try_maintenance_lock",
    "worker_claims",
    "worker_heartbeat",
]
