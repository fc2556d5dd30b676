"""The settings of where the servers are and how rota talks to them:
PostgreSQL and Redis URLs (or files holding them), pooling, the buffer's
shards and bounds, a producer's retries and circuit breaker, timeouts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field

from rota.model.rules import DEAD_LINK_SECONDS
from rota.settings.fields import positive


class ServerSettings(BaseModel):
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

    # The buffer, and how producers write to it
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
    breaker_reset_seconds: float = positive(
        5.0, "Seconds after which a producer that stopped trying Redis tries it again."
    )
    capacity_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Seconds a producer trusts the tenants' capacities and the buffer shards' lengths"
            " it last read (capacities are read again beside the enqueues, not before them)."
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
