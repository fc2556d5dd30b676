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

from rota.model.rules import MAX_ATTEMPTS, MAX_DELAY_SECONDS, check_queue, parse_duration
from rota.runtime.redact import redact_url

# Seconds, from a number or text like "30m", "12h", "7d".
Duration = Annotated[float, BeforeValidator(parse_duration)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROTA_", env_file=".env", extra="ignore", populate_by_name=True
    )

    database_url: str = "postgresql://localhost/postgres"
    # Secrets from files (ROTA_DATABASE_URL_FILE, ...), as container
    # platforms mount them: nothing on a command line, where `ps` shows it.
    database_url_file: Path | None = None
    redis_url_file: Path | None = None
    direct_database_url_file: Path | None = None
    dashboard_token_file: Path | None = None
    # "transaction": ROTA_DATABASE_URL goes through a pooler in transaction
    # mode (PgBouncer's pool_mode = transaction): rota sends no startup
    # options, prepares no statements and keeps no session state between
    # transactions (README, "Behind PgBouncer").
    database_pooling: Literal["none", "transaction"] = "none"
    # A URL that reaches PostgreSQL without the pooler, for what needs a
    # session of its own: a worker's LISTEN, and `rota reaper`'s lock.
    direct_database_url: str | None = None
    redis_url: str = "redis://localhost:6379/0"
    # An allow-list of queue names (comma-separated): when set, enqueues to any
    # other queue are refused and the loader dead-letters them.
    queues: str | None = None

    # Producer
    stream_prefix: str = "rota:buffer"
    # One Spark partition per shard: more shards than cores only add
    # per-batch overhead (docs/benchmarks.md). Raise it with the cores.
    shards: int = Field(default=2, ge=1, le=1024)
    max_payload_bytes: int = Field(default=256 * 1024, ge=64)
    # Entries a shard may hold; past it, enqueues go to the PostgreSQL
    # fallback, so that one tenant cannot fill Redis for everyone.
    buffer_max_entries: int = Field(default=1_000_000, ge=1)
    # Seconds every Redis command may take (ROTA_REDIS_TIMEOUT; a loader's
    # blocking reads have their own, below): short, so that a producer falls
    # back to PostgreSQL quickly when Redis is out.
    redis_timeout: float = Field(
        default=0.5,
        gt=0,
        validation_alias=AliasChoices("ROTA_REDIS_TIMEOUT", "ROTA_REDIS_TIMEOUT_SECONDS"),
    )
    redis_retries: int = Field(default=2, ge=0)
    # Replicas that must have a buffer write before it is acknowledged (WAIT,
    # up to ROTA_REDIS_TIMEOUT). 0: the master's word is enough, and a master
    # lost before its replicas copied a write loses that write.
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    breaker_failures: int = Field(default=3, ge=1)
    breaker_reset_seconds: float = Field(default=5.0, gt=0)
    capacity_cache_seconds: float = Field(default=2.0, ge=0)
    database_timeout_seconds: int = Field(default=5, ge=1)

    # Task defaults
    default_queue: str = "default"
    default_max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    default_backoff_seconds: float = Field(default=1.0, ge=0, le=MAX_DELAY_SECONDS)
    default_backoff_max_seconds: float = Field(default=3600.0, ge=0, le=MAX_DELAY_SECONDS)

    # Loader
    loader_group: str = "rota-loader"
    # Tasks per load transaction: loads of a queue take turns on its lock, so
    # bigger is not always faster (docs/benchmarks.md).
    loader_batch_size: int = Field(default=20_000, ge=1)
    # Tasks per load inside a Spark micro-batch: one loader in one transaction
    # shares no queue lock, so a larger load only saves per-load work (each
    # load looks up and saves every tenant it holds).
    spark_load_size: int = Field(default=100_000, ge=1)
    loader_read_count: int = Field(default=100, ge=1)  # entries read per shard per pass
    loader_idle_reclaim_seconds: float = Field(default=60.0, gt=0)
    # The loaders' Redis socket timeout: longer than their blocking reads.
    loader_redis_timeout_seconds: float = Field(default=30.0, gt=0)
    loader_max_deliveries: int = Field(default=5, ge=1)

    # Consumer
    lease_seconds: float = Field(default=60.0, gt=0)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    poll_seconds: float = Field(default=1.0, gt=0)
    worker_dead_after_seconds: float = Field(default=30.0, gt=0)  # silent this long: dead
    # Maintenance duties, each on its own interval (seconds; the queue's
    # duties default to ROTA_MAINTENANCE_SECONDS).
    maintenance_seconds: float = Field(default=1.0, gt=0)
    promote_seconds: float | None = Field(default=None, gt=0)
    expire_leases_seconds: float | None = Field(default=None, gt=0)
    reap_workers_seconds: float | None = Field(default=None, gt=0)
    cron_seconds: float | None = Field(default=None, gt=0)
    retention_seconds: float = Field(default=60.0, gt=0)  # how often the retention duties run
    # Tenants with their own metric series in a process; the rest are "other".
    metrics_tenants: int = Field(default=20, ge=0, le=10_000)
    # How often the console's figures (rota.stats, rota.service) are refreshed.
    stats_seconds: float = Field(default=5.0, gt=0)
    # What is kept, and for how long.
    finished_retention: Duration = 7 * 86_400.0  # succeeded tasks' records
    dead_retention: Duration = 30 * 86_400.0  # dead tasks
    worker_retention: Duration = 86_400.0  # rows of stopped or dead workers
    loader_ledger_retention: Duration = 86_400.0  # Spark ledger rows past each checkpoint's last
    dead_letter_retention: Duration = 30 * 86_400.0  # the buffer's dead-letter stream
    # On: succeeded, dead and cancelled tasks are kept, whatever their age,
    # until `rota archive` has written them.
    retention_waits_for_archive: bool = False
    cron_lookback_seconds: float = Field(default=300.0, gt=0)  # missed ticks caught up
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    # A task whose name the worker's app does not know is handed back (run
    # again this much later, no attempt used) for a worker that knows it, and
    # is dead only once nobody ran it for the grace.
    unknown_task_retry_seconds: float = Field(default=5.0, gt=0)
    unknown_task_grace_seconds: float = Field(default=600.0, ge=0)
    # Off: workers' claims and reports skip waiting for the WAL flush. A
    # database crash can then forget the last moments of them, and those tasks
    # run again, which at-least-once delivery allows. Loads always wait.
    worker_synchronous_commit: bool = False

    # The console (`rota dashboard`): required for any bind but loopback,
    # and for every action; at least 16 characters.
    dashboard_token: SecretStr | None = Field(default=None, min_length=16)
    # Required by --metrics-port's /metrics on any address but loopback.
    metrics_token: SecretStr | None = Field(default=None, min_length=16)
    # More console tokens, each with a name and scopes: lines of
    # `NAME SCOPES SHA256` (`rota dashboard-token`); only hashes are stored.
    console_tokens_file: Path | None = None
    console_session_seconds: float = Field(default=43_200.0, gt=0, le=30 * 86_400)
    # What one of the console's statements may take (a page or an API call
    # that needs more is refused, not left holding one of its connections).
    console_statement_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    # The Host names the console answers to (comma-separated); others get 400,
    # which keeps a DNS-rebinding page from reaching it through a browser.
    console_allowed_hosts: str = "localhost,127.0.0.1,[::1]"

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
