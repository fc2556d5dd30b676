"""rota's one settings class: every knob, read from ROTA_* environment variables."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from rota.model.rules import (
    DEAD_LINK_SECONDS,
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    check_queue,
    parse_duration,
)
from rota.runtime.redact import redact_url

# Seconds, from a number or text like "30m", "12h", "7d".
Duration = Annotated[float, BeforeValidator(parse_duration)]


def _positive(default: float, description: str) -> Any:
    """A setting that must be above 0 (seconds, mostly)."""
    return Field(default=default, gt=0, description=description)


def _duty_interval(duty: str) -> Any:
    """A maintenance duty's own interval, ROTA_MAINTENANCE_SECONDS unless set."""
    return Field(
        default=None,
        gt=0,
        description=f"Interval in seconds of {duty} (default: ROTA_MAINTENANCE_SECONDS).",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROTA_", env_file=".env", extra="ignore", populate_by_name=True
    )

    database_url: str = Field(
        default="postgresql://localhost/postgres",
        description="PostgreSQL URL of the database that holds every task.",
    )
    # Secrets from files, as container platforms mount them: nothing on a
    # command line, where `ps` shows it.
    database_url_file: Path | None = Field(
        default=None,
        description="File to read ROTA_DATABASE_URL from when it is not set (a mounted secret).",
    )
    redis_url_file: Path | None = Field(
        default=None,
        description="File to read ROTA_REDIS_URL from when it is not set (a mounted secret).",
    )
    direct_database_url_file: Path | None = Field(
        default=None,
        description=(
            "File to read ROTA_DIRECT_DATABASE_URL from when it is not set (a mounted secret)."
        ),
    )
    dashboard_token_file: Path | None = Field(
        default=None,
        description="File to read ROTA_DASHBOARD_TOKEN from when it is not set (a mounted secret).",
    )
    database_pooling: Literal["none", "transaction"] = Field(
        default="none",
        description=(
            "`transaction` when ROTA_DATABASE_URL goes through a pooler in transaction mode"
            " (PgBouncer's pool_mode = transaction): rota then sends no startup options,"
            " prepares no statements and keeps no session state between transactions."
        ),
    )
    direct_database_url: str | None = Field(
        default=None,
        description=(
            "URL that reaches PostgreSQL without the pooler, for the connections that need a"
            " session of their own: a worker's LISTEN and `rota maintenance`'s lock."
        ),
    )
    redis_url: str = Field(
        default="redis://localhost:6379/0",
        description="Redis URL of the buffer that enqueues are written to.",
    )
    queues: str | None = Field(
        default=None,
        description=(
            "Allow-list of queue names (comma-separated): when set, enqueues to any other"
            " queue are refused and the loader dead-letters them."
        ),
    )

    # Producer
    stream_prefix: str = Field(
        default="rota:buffer",
        description="Prefix of the buffer's Redis keys: shard n is the stream `PREFIX:{n}`.",
    )
    # docs/explanation/benchmarks.md has the figures behind the shard count.
    shards: int = Field(
        default=2,
        ge=1,
        le=1024,
        description=(
            "Buffer shards (Redis streams), one Spark partition each: more shards than cores"
            " only add per-batch overhead, so raise it with the cores."
        ),
    )
    max_payload_bytes: int = Field(
        default=256 * 1024,
        ge=64,
        description="Largest JSON payload (arguments) of one task in bytes; larger is refused.",
    )
    max_result_bytes: int = Field(
        default=1024 * 1024,
        ge=64,
        le=64 * 1024 * 1024,
        description=(
            "Largest result (a task's return value as JSON) kept, in bytes; a larger one"
            " is refused with the reason and the task still succeeds."
        ),
    )
    results_prune_seconds: float = _positive(
        60.0, "How often maintenance drops results past their result_ttl."
    )
    buffer_max_entries: int = Field(
        default=1_000_000,
        ge=1,
        description=(
            "Entries one buffer shard may hold; past it, enqueues go to the PostgreSQL"
            " fallback, so that one tenant cannot fill Redis for everyone."
        ),
    )
    redis_timeout: float = Field(
        default=0.5,
        gt=0,
        validation_alias=AliasChoices("ROTA_REDIS_TIMEOUT", "ROTA_REDIS_TIMEOUT_SECONDS"),
        description=(
            "Seconds every Redis command may take (the loaders' blocking reads have their"
            " own): short, so that a producer falls back to PostgreSQL quickly when Redis"
            " is out."
        ),
    )
    redis_retries: int = Field(
        default=2,
        ge=0,
        description="Retries of a failed buffer write before the tasks go to PostgreSQL instead.",
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        le=16,
        description=(
            "Replicas that must have a buffer write before it is acknowledged (WAIT, up to"
            " ROTA_REDIS_TIMEOUT); with 0 the master's word is enough, and a master lost"
            " before its replicas copied a write loses that write."
        ),
    )
    breaker_failures: int = Field(
        default=3,
        ge=1,
        description=(
            "Redis failures in a row after which a producer stops trying Redis for a while"
            " and enqueues go straight to PostgreSQL."
        ),
    )
    breaker_reset_seconds: float = _positive(
        5.0, "Seconds after which a producer that stopped trying Redis tries it again."
    )
    capacity_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Seconds a producer trusts the tenants' capacities and the buffer shards' lengths"
            " it last read."
        ),
    )
    database_timeout_seconds: int = Field(
        default=5, ge=1, description="Seconds a connection to PostgreSQL may take to open."
    )
    database_dead_link_seconds: float = Field(
        default=DEAD_LINK_SECONDS,
        ge=2,
        le=3600,
        description=(
            "Seconds after which a connection to PostgreSQL that hears nothing back is taken"
            " for dead (TCP keepalives, and tcp_user_timeout for data not acknowledged): a"
            " silent partition ends a wait within this, and the process reconnects."
        ),
    )

    # Task defaults
    default_queue: str = Field(default="default", description="Queue of a task that names none.")
    default_max_attempts: int = Field(
        default=3,
        ge=1,
        le=MAX_ATTEMPTS,
        description="Attempts a task gets when it names no max_attempts.",
    )
    default_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        le=MAX_DELAY_SECONDS,
        description=(
            "Base retry delay in seconds when a task names none: doubled per attempt, up to"
            " the maximum, with jitter."
        ),
    )
    default_backoff_max_seconds: float = Field(
        default=3600.0,
        ge=0,
        le=MAX_DELAY_SECONDS,
        description="Longest retry delay in seconds when a task names none.",
    )

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
    loader_idle_reclaim_seconds: float = _positive(
        60.0,
        (
            "Seconds an entry may stay unacknowledged in another loader's hands before a"
            " loader takes it over (that loader is taken for dead)."
        ),
    )
    loader_redis_timeout_seconds: float = _positive(
        30.0, "Redis socket timeout of the loaders in seconds, above their blocking reads."
    )
    loader_max_deliveries: int = Field(
        default=5,
        ge=1,
        description="Deliveries of a buffer entry after which the loaders dead-letter it.",
    )

    # Consumer
    lease_seconds: float = _positive(
        60.0,
        (
            "Seconds a claimed task stays a worker's without a heartbeat; then it is run"
            " again elsewhere."
        ),
    )
    heartbeat_seconds: float = _positive(
        10.0, "Seconds between a worker's heartbeats, which extend its tasks' leases."
    )
    poll_seconds: float = _positive(
        1.0, "Seconds an idle worker waits between claims when no notification wakes it."
    )
    worker_dead_after_seconds: float = _positive(
        30.0,
        (
            "Seconds a worker may stay silent before it is declared dead (its tasks go back"
            " in line as their leases pass; at once if its process is gone from this host)."
        ),
    )
    maintenance_seconds: float = _positive(
        1.0,
        (
            "Interval in seconds of the queue's maintenance duties (promote, expire leases,"
            " reap workers, cron) that have no interval of their own."
        ),
    )
    promote_seconds: float | None = _duty_interval("moving tasks whose time has come into line")
    expire_leases_seconds: float | None = _duty_interval("putting back tasks whose lease ran out")
    reap_workers_seconds: float | None = _duty_interval("declaring silent workers dead")
    cron_seconds: float | None = _duty_interval("enqueueing the cron schedules' due runs")
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
    stats_seconds: float = _positive(
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
    cron_lookback_seconds: float = _positive(
        300.0, "How far back in seconds the cron duty catches up missed ticks."
    )
    shutdown_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds a stopping worker lets its running tasks finish before it hands them back."
        ),
    )
    unknown_task_retry_seconds: float = _positive(
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

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, values: Any) -> Any:
        """ROTA_X_FILE: the setting X read from that file (stripped), unless
        X itself is given."""
        if not isinstance(values, dict):
            return values
        for name in ("database_url", "redis_url", "direct_database_url", "dashboard_token"):
            path = values.get(f"{name}_file")
            if path and not values.get(name):
                try:
                    values[name] = Path(path).read_text().strip()
                except OSError as exc:
                    raise ValueError(
                        f"ROTA_{name.upper()}_FILE: cannot read {path}: {exc.strerror}"
                    ) from None
        return values

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: str | None) -> str | None:
        if value is not None:
            for name in _names(value):
                check_queue(name)
        return value

    @property
    def console_hosts(self) -> list[str]:
        return [h.strip() for h in self.console_allowed_hosts.split(",") if h.strip()]

    @property
    def transaction_pooling(self) -> bool:
        return self.database_pooling == "transaction"

    @property
    def session_database_url(self) -> str | None:
        """Where a connection that keeps session state (LISTEN, an advisory
        lock) goes: the database URL, or behind a transaction pooler the
        direct one (None when there is none)."""
        return self.direct_database_url if self.transaction_pooling else self.database_url

    @property
    def allowed_queues(self) -> frozenset[str] | None:
        # Not a cached_property: model_copy(update=...) would carry a stale one.
        return _allowed(self.queues)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Passwords never reach a log line or a traceback's repr.
        for name, value in super().__repr_args__():
            secret = name in ("database_url", "redis_url", "direct_database_url") and value
            yield name, redact_url(value) if secret else value


@functools.lru_cache(maxsize=64)
def _allowed(queues: str | None) -> frozenset[str] | None:
    return None if queues is None else frozenset(_names(queues))


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]
