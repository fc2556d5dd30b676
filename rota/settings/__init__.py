"""rota's one settings class, `Settings`: every knob, read from ROTA_*
environment variables. Its fields are grouped by what they tune: the servers
(rota.settings.servers), each role (rota.settings.roles), and here the
bounds and defaults of every task."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rota.model.rules import MAX_ATTEMPTS, MAX_DELAY_SECONDS, check_queue
from rota.runtime.redact import redact_url
from rota.settings.fields import positive
from rota.settings.roles import RoleSettings
from rota.settings.servers import ServerSettings

__all__ = ["Settings"]


class Settings(BaseSettings, RoleSettings, ServerSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROTA_", env_file=".env", extra="ignore", populate_by_name=True
    )

    queues: str | None = Field(
        default=None,
        description=(
            "Allow-list of queue names (comma-separated): when set, enqueues to any other"
            " queue are refused and the loader dead-letters them."
        ),
    )

    # Bounds and defaults of every task
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
    results_prune_seconds: float = positive(
        60.0, "How often maintenance drops results past their result_ttl."
    )
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
