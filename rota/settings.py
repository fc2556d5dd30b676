"""rota's one settings class: every knob, read from ROTA_* environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROTA_", env_file=".env", extra="ignore")

    database_url: str = "postgresql://localhost/postgres"
    redis_url: str = "redis://localhost:6379/0"

    # Producer
    stream_prefix: str = "rota:buffer"
    # One Spark partition per shard: on local[2], more shards than cores only
    # add per-batch overhead (enqueue -> claimable p50 0.65 s with 2, 1.4 s with
    # 8). Raise it to spread over a Redis Cluster or a Spark cluster.
    shards: int = Field(default=2, ge=1, le=1024)
    max_payload_bytes: int = Field(default=256 * 1024, ge=64)
    redis_timeout_seconds: float = Field(default=0.5, gt=0)
    redis_retries: int = Field(default=2, ge=0)
    breaker_failures: int = Field(default=3, ge=1)
    breaker_reset_seconds: float = Field(default=5.0, gt=0)
    capacity_cache_seconds: float = Field(default=2.0, ge=0)
    database_timeout_seconds: int = Field(default=5, ge=1)

    # Task defaults
    default_queue: str = "default"
    default_max_attempts: int = Field(default=3, ge=1)
    default_backoff_seconds: float = Field(default=1.0, ge=0)
    default_backoff_max_seconds: float = Field(default=3600.0, ge=0)

    # Loader
    loader_group: str = "rota-loader"
    # Tasks per load transaction: 20k loaded ~14% faster than 10k (2 loaders,
    # alternating runs), 40k slower again (loads of a queue take turns on its lock).
    loader_batch_size: int = Field(default=20_000, ge=1)
    # Tasks per load inside a Spark micro-batch: one loader in one transaction
    # shares no queue lock, so a larger load only saves per-load work (each
    # load looks up and saves every tenant it holds). Alternating sets: 50k
    # against 20k 58.5k and 61.8k against 56.0k and 55.3k tasks/s; 100k
    # against 50k 51.3k and 59.7k against 48.6k and 49.3k.
    spark_load_size: int = Field(default=100_000, ge=1)
    loader_read_count: int = Field(default=100, ge=1)  # entries read per shard per pass
    loader_idle_reclaim_seconds: float = Field(default=60.0, gt=0)
    loader_max_deliveries: int = Field(default=5, ge=1)

    # Consumer
    lease_seconds: float = Field(default=60.0, gt=0)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    poll_seconds: float = Field(default=1.0, gt=0)
    worker_dead_after_seconds: float = Field(default=30.0, gt=0)  # silent this long: dead
    maintenance_seconds: float = Field(default=1.0, gt=0)
    cron_lookback_seconds: float = Field(default=300.0, gt=0)  # missed ticks caught up
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    # Off: workers' claims and reports skip waiting for the WAL flush. A
    # database crash can then forget the last moments of them, and those tasks
    # run again, which at-least-once delivery allows. Loads always wait.
    worker_synchronous_commit: bool = False
