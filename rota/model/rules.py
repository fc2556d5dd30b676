"""The rules every task and tenant setting obeys, defined once.

The SDK, the `connection=` path, the fallback, the loader's reading of raw
buffer entries, `rota import` and `rota tenant` all check with these
functions (or, for untrusted JSON, pydantic types built from the same
constants), and the database's CHECKs repeat them as the last line; a test
reads the CHECKs back from the schema and compares them with these constants.
Bounds are documented in the README ("Bounds").

Every check raises `rota.ValidationError` (or a subclass) and never anything
else, whatever the type of the value: a string where a number belongs is a
ValidationError, not an AttributeError.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from rota.errors import InvalidName, ValidationError

# Names, matched whole (`re.fullmatch` here, `^...$` in PostgreSQL and pydantic,
# whose `$` matches only at the very end).
QUEUE_PATTERN = r"[a-z][a-z0-9_.-]{0,62}"
TENANT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}"
TASK_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*"
# A key of a limit on keys: the limit's name (a queue name's rule), alone or
# with a value after '/' (one key per value): `stripe`, `reports/acme:render`.
LIMIT_KEY_VALUE_MAX = 200
LIMIT_KEY_PATTERN = rf"{QUEUE_PATTERN}(?:/[^\x00-\x1f\x7f]{{1,{LIMIT_KEY_VALUE_MAX}}})?"
QUEUE_NAME_MAX = 63
TENANT_NAME_MAX = 128
TASK_NAME_MAX = 200
IDEMPOTENCY_KEY_MAX = 1024

# Numbers a task carries.
MAX_COST = 1e6  # cost in (0, MAX_COST]: fair tags are sums of cost / weight in float8
MAX_ATTEMPTS = 10_000
# Every delay (countdown, Retry countdown, backoff, backoff max): at most ten
# years, so that now + delay is far from any timestamp limit.
MAX_DELAY_SECONDS = 10 * 365 * 86_400.0
MAX_TIMEOUT_SECONDS = 7 * 86_400.0
# A task's priority within its tenant: 0 (normal, the default) to 9, higher
# first. It orders a tenant's own tasks only, never the tenants.
MIN_PRIORITY, MAX_PRIORITY = PRIORITY_RANGE = (0, 9)
# Every time a task carries (eta, enqueued_at) lies in [EARLIEST, LATEST).
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
# JSON integers in arguments: what a 64-bit integer holds (orjson's range);
# a larger one would come back to a worker as a float.
INT_RANGE = (-(2**63), 2**64 - 1)

# A connection that hears nothing back for this long is taken for dead
# (Settings.database_dead_link_seconds, rota.runtime.links): without it a silent
# partition (packets dropped, no reset) hangs a wait for the kernel's two hours.
DEAD_LINK_SECONDS = 20.0

# Tenant settings.
WEIGHT_RANGE = (1e-6, 1e6)
MAX_CONCURRENCY_LIMIT = 1_000_000
MAX_RATE_LIMIT = 1e6  # tasks per second
MAX_RATE_BURST = 1e9
MAX_CAPACITY = 10**12  # cost units waiting

_VALID_NAMES_MAX = 65_536


class _NameRule:
    """One kind of name: its pattern, its cap and the rule said when refused.
    Valid names are remembered (a process sees few, and checks them once per
    task it enqueues or loads); rejected names are never kept."""

    def __init__(self, what: str, pattern: str, max_length: int, rule: str) -> None:
        self.what, self.pattern, self.max_length = what, re.compile(pattern), max_length
        self.rule = rule
        self.valid: set[str] = set()

    def check(self, name: object) -> str:
        if type(name) is str and name in self.valid:
            return name
        if (
            type(name) is not str
            or len(name) > self.max_length  # before the pattern: names may be megabytes
            or self.pattern.fullmatch(name) is None
        ):
            raise InvalidName(f"{self.what} name {_shown(name)} is invalid: {self.rule}")
        if len(self.valid) >= _VALID_NAMES_MAX:
            self.valid.clear()
        self.valid.add(name)
        return name


def _shown(value: object) -> str:
    """A value for an error message, cut short (names may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_QUEUE_NAMES = _NameRule(
    "queue",
    QUEUE_PATTERN,
    QUEUE_NAME_MAX,
    f"1-{QUEUE_NAME_MAX} characters of a-z, 0-9, '_', '.', '-', starting with a letter",
)
_TENANT_NAMES = _NameRule(
    "tenant",
    TENANT_PATTERN,
    TENANT_NAME_MAX,
    f"1-{TENANT_NAME_MAX} characters of letters, digits, '_', '.', ':', '@', '-', "
    "starting with a letter or digit",
)
_TASK_NAMES = _NameRule(
    "task",
    TASK_PATTERN,
    TASK_NAME_MAX,
    f"a dotted Python-style name of at most {TASK_NAME_MAX} characters",
)
_LIMIT_NAMES = _NameRule(
    "limit",
    QUEUE_PATTERN,
    QUEUE_NAME_MAX,
    f"1-{QUEUE_NAME_MAX} characters of a-z, 0-9, '_', '.', '-', starting with a letter",
)
_LIMIT_KEYS = _NameRule(
    "limit key",
    LIMIT_KEY_PATTERN,
    QUEUE_NAME_MAX + 1 + LIMIT_KEY_VALUE_MAX,
    f"a limit's name, alone or with '/' and a value of 1-{LIMIT_KEY_VALUE_MAX} characters "
    "(no control characters)",
)
check_queue = _QUEUE_NAMES.check
check_limit_name = _LIMIT_NAMES.check
check_limit_key = _LIMIT_KEYS.check
check_tenant = _TENANT_NAMES.check
check_task_name = _TASK_NAMES.check


def check_idempotency_key(key: object) -> str:
    if type(key) is not str or not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        raise ValidationError(
            f"idempotency_key must be a string of 1-{IDEMPOTENCY_KEY_MAX} characters, "
            f"got {_shown(key)}"
        )
    return key


def is_number(value: object) -> bool:
    """An int or float, not a bool (True is an int to Python, not to a user)."""
    return (
        type(value) is float
        or type(value) is int
        or (isinstance(value, int | float) and not isinstance(value, bool))
    )


def check_number(
    what: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    integer: bool = False,
) -> Any:
    """`value` is a finite number (an int if `integer`) in [low, high], or
    (low, high] with `low_open`; returns it."""
    ok = is_number(value) and (isinstance(value, int) or not integer)
    if ok:
        ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        kind = "an integer" if integer else "a number"
        bracket = "(" if low_open else "["
        raise ValidationError(
            f"{what} must be {kind} in {bracket}{low:g}, {high:g}], got {_shown(value)}"
        )
    return value


def check_delay(what: str, seconds: Any) -> float:
    return float(check_number(what, seconds, 0, MAX_DELAY_SECONDS))


def check_cost(cost: Any) -> float:
    if (type(cost) is float or type(cost) is int) and 0 < cost <= MAX_COST:
        return float(cost)  # the usual case, without the general check's calls
    return float(check_number("cost", cost, 0, MAX_COST, low_open=True))


def check_priority(value: Any) -> int:
    if type(value) is int and MIN_PRIORITY <= value <= MAX_PRIORITY:
        return value  # the usual case, without the general check's calls
    return int(check_number("priority", value, MIN_PRIORITY, MAX_PRIORITY, integer=True))


def check_max_attempts(value: Any) -> int:
    return int(check_number("max_attempts", value, 1, MAX_ATTEMPTS, integer=True))


# A result is kept at most a year.
RESULT_TTL_MAX = 365 * 86400.0


def check_result_ttl(value: Any) -> float:
    """Seconds a result is kept: above 0, at most a year."""
    return float(check_number("result_ttl", value, 0.0, RESULT_TTL_MAX, low_open=True))


def check_timeout(value: Any, what: str = "timeout") -> float | None:
    if value is None:
        return None
    return float(check_number(what, value, 0, MAX_TIMEOUT_SECONDS, low_open=True))


def check_soft_timeout(value: Any, timeout: Any) -> float | None:
    """A soft time limit: below the hard one (`timeout`) when both are set."""
    soft = check_timeout(value, "soft_timeout")
    if soft is not None and timeout is not None and soft >= timeout:
        raise ValidationError(
            f"soft_timeout ({soft:g} s) must be below timeout ({timeout:g} s): the soft "
            "limit warns the task before the hard one kills it"
        )
    return soft


def check_time(what: str, value: Any) -> datetime:
    """A timezone-aware datetime in [EARLIEST, LATEST)."""
    if not isinstance(value, datetime):
        raise ValidationError(
            f"{what} must be a timezone-aware datetime, got {type(value).__name__} {_shown(value)}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"{what} must be timezone-aware (e.g. datetime.now(UTC))")
    if not EARLIEST <= value < LATEST:
        raise ValidationError(
            f"{what} must lie from {EARLIEST.date()} to before {LATEST.date()}, "
            f"got {value.isoformat()}"
        )
    return value


def resolve_eta(eta: Any, countdown: Any, now: datetime) -> datetime | None:
    """The time a task may first run: `eta`, or `countdown` seconds from now."""
    if eta is not None and countdown is not None:
        raise ValidationError("give eta or countdown, not both")
    if countdown is not None:
        return now + timedelta(seconds=check_delay("countdown", countdown))
    if eta is None:
        return None
    return check_time("eta", eta)


def check_json_integers(text: str | bytes) -> None:
    """Refuses JSON integers outside INT_RANGE (a JSON parser would turn them
    into floats, silently). Only text with a run of 19 digits can hold one,
    so the slow parse runs only then."""
    if isinstance(text, str):
        text = text.encode()
    # Two C-speed filters, each exact about a 19-digit run being absent: fewer
    # than 19 digits in all (most payloads), or no 19 digits in a row.
    if len(text) - len(text.translate(None, _DIGITS)) < _LONG_RUN:
        return
    if _LONG_ZEROS not in text.translate(_DIGITS_TO_ZERO):
        return
    import json

    low, high = INT_RANGE

    def parse_int(digits: str) -> int:
        number = int(digits)
        if not low <= number <= high:
            raise ValidationError(f"integer {digits[:30]}... does not fit in 64 bits")
        return number

    json.loads(text, parse_int=parse_int)


_LONG_RUN = 19  # digits: the shortest integer that may not fit in 64 bits
_DIGITS = b"0123456789"
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_ZEROS = b"0" * _LONG_RUN


def check_tenant_settings(
    *,
    weight: Any = None,
    concurrency_limit: Any = None,
    rate_limit: Any = None,
    rate_burst: Any = None,
    capacity: Any = None,
) -> None:
    """Each setting given (not None) within its bounds."""
    low, high = WEIGHT_RANGE
    if weight is not None:
        check_number("weight", weight, low, high)
    if concurrency_limit is not None:
        check_number("concurrency_limit", concurrency_limit, 0, MAX_CONCURRENCY_LIMIT, integer=True)
    if rate_limit is not None:
        check_number("rate_limit", rate_limit, 0, MAX_RATE_LIMIT, low_open=True)
    if rate_burst is not None:
        check_number("rate_burst", rate_burst, 1, MAX_RATE_BURST)
    if capacity is not None:
        check_number("capacity", capacity, 0, MAX_CAPACITY, integer=True)


_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)?")
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}


def parse_duration(value: object) -> float:
    """Seconds from a number, or from text like "90", "30m", "12h", "7d", "2w"."""
    if is_number(value):
        seconds = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value.strip())):
        seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"]]
    else:
        raise ValidationError(
            f"a duration is a number of seconds or text like 30m, 12h, 7d; got {_shown(value)}"
        )
    return float(check_number("duration", seconds, 0, 100 * 365 * 86_400.0))
