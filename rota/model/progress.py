"""A running task's progress (`rota.context().progress`): its rules, checked
where the task calls it, and what readers get back (`app.result(id).progress()`).

The database's CHECKs on rota.progress repeat the rules as the last line."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from datetime import datetime

from rota.errors import ValidationError

# A longer message is cut to this many characters, its last an ellipsis.
MESSAGE_MAX = 500

# What a task reported: (done, total or None, message or None), as stored.
Values = tuple[float, float | None, str | None]


@dataclass(frozen=True)
class Progress:
    """A task's last reported progress (`app.result(id).progress()`).

    `done` and `total` are what the task passed to
    `rota.context().progress()`, as floats; `message` its message, if any;
    `reported_at` when its worker stored it (within about a second of the
    call); `attempt` the attempt that reported it; `fraction` is
    `done / total`, from 0.0 to 1.0 (1.0 for a total of 0), None without a
    total."""

    done: float
    total: float | None
    message: str | None
    reported_at: datetime
    attempt: int
    fraction: float | None = field(init=False)

    def __post_init__(self) -> None:
        if self.total is None:
            fraction = None
        else:
            fraction = 1.0 if self.total == 0 else min(1.0, self.done / self.total)
        object.__setattr__(self, "fraction", fraction)


def check_progress(done: object, total: object = None, message: object = None) -> Values:
    """The values of one progress report, as stored; raises ValidationError
    for a number that is not finite and non-negative, `done` above `total`, or
    a message that is not a str. A message over MESSAGE_MAX characters is cut
    to that length, its last character an ellipsis."""
    done_ = _number("done", done)
    total_ = None if total is None else _number("total", total)
    if total_ is not None and done_ > total_:
        raise ValidationError(f"progress: done ({done!r}) is more than total ({total!r})")
    if message is not None:
        if type(message) is not str and not isinstance(message, str):
            raise ValidationError(f"progress: message is a str, not {type(message).__name__}")
        if len(message) > MESSAGE_MAX:
            message = message[: MESSAGE_MAX - 1] + "…"
    return done_, total_, message


def _number(what: str, value: object) -> float:
    # int and float first (the common case, and cheap); bool is no number here.
    if (type(value) is not int and type(value) is not float) and (
        isinstance(value, bool) or not isinstance(value, numbers.Real)
    ):
        raise ValidationError(
            f"progress: {what} is a number (int or float), not {type(value).__name__}"
        )
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        raise ValidationError(
            f"progress: {what} ({str(value)[:40]}) is not a finite number"
        ) from None
    if not 0.0 <= number < math.inf:  # NaN fails both
        raise ValidationError(f"progress: {what} is a finite number of at least 0, not {value!r}")
    return number
