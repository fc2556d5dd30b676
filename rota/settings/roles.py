"""The settings of each role: loaders (Python and Spark), workers,
maintenance and retention, the dashboard."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from rota.settings.fields import Duration, duty_interval, positive


class RoleSettings(BaseModel):
    # Loader
    loader_group: str = Field(
        default="rota-loader",
        description="Redis consumer group the loaders read the buffer's shards with.",
    )
    # docs/explanation/benchmarks.md has the figures behind the batch size.
    loader_batch_size: int = Field(
        default=20_000,
        ge=1,
        description=(
            "Tasks per load transaction: loads that share a tenant take turns on its fair"
            " tag until one commits, so bigger is not always faster."
        ),
    )
    spark_shard_connections: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Connections loading one buffer shard in a Spark micro-batch, each a transaction"
            " of its own for a group of the shard's tenants (a tenant's tasks stay in one, in"
            " enqueue order): one tenant's flood no longer holds its whole shard to one"
            " connection's speed."
        ),
    )
    spark_load_size: int = Field(
        default=20_000,
        ge=1,
        description=(
            "Tasks per load inside a Spark micro-batch: each group of a shard's tenants hands"
            " its connection a load once it holds this many and the connection is free (more"
            " while it is busy, up to four times this), all in the group's one transaction."
        ),
    )
    loader_read_count: int = Field(
        default=100, ge=1, description="Buffer entries a loader reads per shard per pass."
    )
    loader_idle_reclaim_seconds: float = positive(
        60.0,
        (
            "Seconds an entry may stay unacknowledged in another loader's hands before a"
            " loader takes it over (that loader is taken for dead)."
        ),
    )
    loader_redis_timeout_seconds: float = positive(
        30.0, "Redis socket timeout of the loaders in seconds, above their blocking reads."
    )
    loader_max_deliveries: int = Field(
        default=5,
        ge=1,
        description="Deliveries of a buffer entry after which the loaders dead-letter it.",
    )

    # Consumer
    lease_seconds: float = positive(
        60.0,
        (
            "Seconds a claimed task stays a worker's without a heartbeat; then it is run"
            " again elsewhere."
        ),
    )
    heartbeat_seconds: float = positive(
        10.0, "Seconds between a worker's heartbeats, which extend its tasks' leases."
    )
    poll_seconds: float = positive(
        1.0, "Seconds an idle worker waits between claims when no notification wakes it."
    )
    worker_dead_after_seconds: float = positive(
        30.0,
        (
            "Seconds a worker may stay silent before it is declared dead (its tasks go back"
            " in line as their leases pass; at once if its process is gone from this host)."
        ),
    )
    maintenance_seconds: float = positive(
        1.0,
        (
            "Interval in seconds of the queue's maintenance duties (promote, expire leases,"
            " reap workers, cron) that have no interval of their own."
        ),
    )
    promote_seconds: float | None = duty_interval("moving tasks whose time has come into line")
    expire_leases_seconds: float | None = duty_interval("putting back tasks whose lease ran out")
    reap_workers_seconds: float | None = duty_interval("declaring silent workers dead")
    cron_seconds: float | None = duty_interval("enqueueing the cron schedules' due runs")
    retention_seconds: float = Field(
        default=60.0, gt=0, description="How often the retention duties run, in seconds."
    )
    metrics_tenants: int = Field(
        default=20,
        ge=0,
        le=10_000,
        description=(
            "Tenants with their own metric series in a process; the rest are summed under `other`."
        ),
    )
    stats_seconds: float = positive(
        5.0, "How often the console's figures (rota.stats, rota.service) are refreshed."
    )
    # What is kept, and for how long: seconds, or text like "30m", "12h", "7d".
    finished_retention: Duration = Field(
        default=7 * 86_400.0, description="How long succeeded tasks' records are kept."
    )
    dead_retention: Duration = Field(
        default=30 * 86_400.0, description="How long dead tasks are kept."
    )
    worker_retention: Duration = Field(
        default=86_400.0, description="How long the rows of stopped or dead workers are kept."
    )
    loader_ledger_retention: Duration = Field(
        default=86_400.0,
        description="How long the Spark loader's ledger rows are kept past each checkpoint's last.",
    )
    dead_letter_retention: Duration = Field(
        default=30 * 86_400.0,
        description="How long entries stay in the buffer's dead-letter stream.",
    )
    retention_waits_for_archive: bool = Field(
        default=False,
        description=(
            "When on, succeeded, dead and cancelled tasks are kept, whatever their age, until"
            " `rota archive` has written them."
        ),
    )
    cron_lookback_seconds: float = positive(
        300.0, "How far back in seconds the cron duty catches up missed ticks."
    )
    shutdown_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds a stopping worker lets its running tasks finish before it hands them back."
        ),
    )
    unknown_task_retry_seconds: float = positive(
        5.0,
        (
            "Seconds after which a task whose name the worker's app does not know is run"
            " again (no attempt used), for a worker that knows it."
        ),
    )
    unknown_task_grace_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Seconds after which a task that no worker knows how to run is dead.",
    )
    worker_synchronous_commit: bool = Field(
        default=False,
        description=(
            "When on, workers' claims and reports wait for the WAL flush; when off, a"
            " database crash can forget their last moments and those tasks run again, which"
            " at-least-once delivery allows (loads always wait)."
        ),
    )

    # The console (`rota dashboard`)
    dashboard_token: SecretStr | None = Field(
        default=None,
        min_length=16,
        description=(
            "The console's token of every scope, at least 16 characters: required for any"
            " bind but loopback, and for every action."
        ),
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        min_length=16,
        description=(
            "Token that --metrics-port's /metrics requires on any address but loopback, at"
            " least 16 characters."
        ),
    )
    console_tokens_file: Path | None = Field(
        default=None,
        description=(
            "File of further console tokens, each with a name and scopes, as lines of"
            " `NAME SCOPES SHA256` (`rota dashboard-token` makes them; only hashes are stored)."
        ),
    )
    console_session_seconds: float = Field(
        default=43_200.0,
        gt=0,
        le=30 * 86_400,
        description="Seconds a console login lasts.",
    )
    console_statement_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds one of the console's statements may take: a page or an API call that"
            " needs more is refused, not left holding one of its connections."
        ),
    )
    console_allowed_hosts: str = Field(
        default="localhost,127.0.0.1,[::1]",
        description=(
            "Host names the console answers to (comma-separated); others get 400, which"
            " keeps a DNS-rebinding page from reaching it through a browser."
        ),
    )
