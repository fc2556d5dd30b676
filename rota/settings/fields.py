"""What the settings' fields are made of."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from rota.model.rules import parse_duration

# Seconds, from a number or text like "30m", "12h", "7d".
Duration = Annotated[float, BeforeValidator(parse_duration)]


def positive(default: float, description: str) -> Any:
    """A setting that must be above 0 (seconds, mostly)."""
    return Field(default=default, gt=0, description=description)


def duty_interval(duty: str) -> Any:
    """A maintenance duty's own interval, ROTA_MAINTENANCE_SECONDS unless set."""
    return Field(
        default=None,
        gt=0,
        description=f"Interval in seconds of {duty} (default: ROTA_MAINTENANCE_SECONDS).",
    )
