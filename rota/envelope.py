"""The task envelope: what a task is on the wire, in the buffer and in staging.

One set of rules for every path in: the producer builds envelopes with
`make_envelope` (fast, no model per task), the loader parses buffer entries
with `parse_envelope` (pydantic), and both check names and payloads the same way.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID, SafeUUID

import orjson
import uuid_utils
from pydantic import AwareDatetime, ConfigDict, Field, StringConstraints, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from rota.errors import InvalidName, NotJSONSerializable, PayloadTooLarge, ValidationError

ENVELOPE_VERSION: Literal[1] = 1

# The documented name rules (README, "Names"). The database checks the same.
QUEUE_NAME = r"^[a-z][a-z0-9_.-]{0,62}$"
TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"
TASK_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*$"
TASK_NAME_MAX = 200
# The database keeps attempts in an integer column.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
# Costs and weights are bounded so that fair tags (sums of cost / weight in
# double precision) can neither overflow nor lose their increments.
MAX_COST = 1e6
WEIGHT_RANGE = (1e-6, 1e6)

_QUEUE_RE = re.compile(QUEUE_NAME)
_TENANT_RE = re.compile(TENANT_NAME)
_TASK_RE = re.compile(TASK_NAME)

_JSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


@functools.lru_cache(maxsize=65536)  # few distinct names, checked once per task
def _matches(pattern: re.Pattern[str], name: str) -> bool:
    return pattern.match(name) is not None


def check_queue(name: object) -> str:
    if not isinstance(name, str) or not _matches(_QUEUE_RE, name):
        raise InvalidName(
            f"queue name {name!r} is invalid: 1-63 characters of a-z, 0-9, '_', '.', '-', "
            "starting with a letter"
        )
    return name


def check_tenant(name: object) -> str:
    if not isinstance(name, str) or not _matches(_TENANT_RE, name):
        raise InvalidName(
            f"tenant name {name!r} is invalid: 1-128 characters of letters, digits, "
            "'_', '.', ':', '@', '-', starting with a letter or digit"
        )
    return name


def check_task_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > TASK_NAME_MAX or not _matches(_TASK_RE, name):
        raise InvalidName(
            f"task name {name!r} is invalid: a dotted Python-style name of at most "
            f"{TASK_NAME_MAX} characters"
        )
    return name


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


def dump_payload(args: Any, kwargs: Any, max_bytes: int) -> str:
    """Serialises a task's arguments as JSON text, refusing what JSON cannot hold."""
    if not isinstance(args, list | tuple):
        raise NotJSONSerializable(f"args must be a list, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise NotJSONSerializable(f"kwargs must be a dict, got {type(kwargs).__name__}")
    payload = {"args": list(args), "kwargs": kwargs}
    try:
        data = orjson.dumps(payload, default=_refuse, option=_JSON_OPTIONS)
    except TypeError as exc:
        raise NotJSONSerializable(f"task arguments are not JSON: {exc}") from None
    if b"null" in data:
        # orjson writes NaN and infinities as null; the slow path tells them apart.
        try:
            json.dumps(payload, allow_nan=False)
        except ValueError as exc:
            raise NotJSONSerializable(f"task arguments are not JSON: {exc}") from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"task arguments are {len(data)} bytes of JSON, over the cap of {max_bytes}"
        )
    return data.decode()


_SAFE_UNKNOWN = SafeUUID.unknown


def new_task_id() -> UUID:
    """A time-ordered UUIDv7: ids sort by creation, and index inserts stay local."""
    # uuid_utils.compat.uuid7() builds the stdlib UUID the same way, but looks the
    # enum member up on every call: this takes half the time (0.9 vs 1.7 µs),
    # on the producer's per-task path.
    task_id = object.__new__(UUID)
    object.__setattr__(task_id, "int", uuid_utils.uuid7().int)
    object.__setattr__(task_id, "is_safe", _SAFE_UNKNOWN)
    return task_id


def task_id_for_key(idempotency_key: str, tenant: str) -> UUID:
    """The same key (per tenant) always names the same task: a second enqueue is a no-op."""
    return UUID(
        bytes=uuid_utils.uuid5(uuid_utils.NAMESPACE_URL, f"rota:{tenant}:{idempotency_key}").bytes
    )


@dataclass(slots=True)
class TaskEnvelope:
    """Version 1 of the envelope. Field names are part of the buffer format.

    A plain dataclass: the producer builds one per task on its hot path (and
    orjson writes dataclasses natively); the loader validates untrusted ones
    with pydantic (`parse_envelope`), using the constraints annotated here.
    Treat it as immutable (not frozen: that costs 2 µs a task)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    id: UUID
    queue: Annotated[str, StringConstraints(pattern=QUEUE_NAME)]
    tenant: Annotated[str, StringConstraints(pattern=TENANT_NAME)]
    name: Annotated[str, StringConstraints(pattern=TASK_NAME, max_length=TASK_NAME_MAX)]
    payload: str
    enqueued_at: AwareDatetime
    cost: Annotated[float, Field(gt=0, le=MAX_COST, allow_inf_nan=False)] = 1.0
    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT)] = 3
    backoff_base: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    backoff_max: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 3600.0
    eta: AwareDatetime | None = None
    v: Literal[1] = ENVELOPE_VERSION

    def copy_row(self) -> tuple[Any, ...]:
        """The row COPY'd into rota_staging (column order of the copy_staging block)."""
        return (
            self.id,
            self.queue,
            self.tenant,
            self.name,
            self.payload,
            self.cost,
            self.max_attempts,
            self.backoff_base,
            self.backoff_max,
            self.eta,
            self.enqueued_at,
        )

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def list_from_checked_json(cls, raw: str | bytes) -> list[TaskEnvelope]:
        """Rebuilds envelopes that were validated, then written as a JSON list by
        orjson (the Spark executors check, the driver only rebuilds)."""
        return [
            cls(
                id=UUID(d["id"]),
                queue=d["queue"],
                tenant=d["tenant"],
                name=d["name"],
                payload=d["payload"],
                enqueued_at=datetime.fromisoformat(d["enqueued_at"]),
                cost=d["cost"],
                max_attempts=d["max_attempts"],
                backoff_base=d["backoff_base"],
                backoff_max=d["backoff_max"],
                eta=datetime.fromisoformat(d["eta"]) if d["eta"] else None,
            )
            for d in orjson.loads(raw)
        ]


_ENVELOPE = TypeAdapter(TaskEnvelope)
_ENVELOPES = TypeAdapter(list[TaskEnvelope])


@dataclass(frozen=True, slots=True)
class EnvelopeTemplate:
    """The checked fields that every run of a task shares (name, queue, retry
    policy): checked once per distinct set, so that each run only checks what
    is its own (tenant, cost, eta, arguments)."""

    name: str
    queue: str
    max_attempts: int
    backoff_base: float
    backoff_max: float

    def build(
        self,
        tenant: str,
        args: Any = (),
        kwargs: Any = None,
        task_id: UUID | None = None,
        cost: float = 1.0,
        eta: datetime | None = None,
        max_payload_bytes: int = 256 * 1024,
        now: datetime | None = None,
    ) -> TaskEnvelope:
        """Checks one run and builds its envelope; raises a ValidationError subclass."""
        check_tenant(tenant)
        if not isinstance(cost, int | float) or not 0 < cost <= MAX_COST:
            raise ValidationError(f"cost must be a number > 0 and <= {MAX_COST:g}, got {cost!r}")
        if eta is not None and eta.tzinfo is None:
            raise ValidationError("eta must be timezone-aware (e.g. datetime.now(UTC))")
        payload = dump_payload(args, {} if kwargs is None else kwargs, max_payload_bytes)
        # Every field is checked: no validation pass per task here (positional
        # arguments, in field order: keywords cost a producer ~0.5 µs a task).
        return TaskEnvelope(
            task_id or new_task_id(),
            self.queue,
            tenant,
            self.name,
            payload,
            now or datetime.now(UTC),
            float(cost),
            self.max_attempts,
            self.backoff_base,
            self.backoff_max,
            eta,
        )


def envelope_template(
    name: str,
    queue: str,
    max_attempts: int = 3,
    backoff_base: float = 1.0,
    backoff_max: float = 3600.0,
) -> EnvelopeTemplate:
    """The checked template of a task's runs; raises a ValidationError subclass."""
    if type(name) is str and type(queue) is str and type(max_attempts) is int:
        # Hashable and exactly typed: the cache cannot mix up 1, 1.0 and True.
        return _cached_template(name, queue, max_attempts, backoff_base, backoff_max)
    return _checked_template(name, queue, max_attempts, backoff_base, backoff_max)


def _checked_template(
    name: Any, queue: Any, max_attempts: Any, backoff_base: Any, backoff_max: Any
) -> EnvelopeTemplate:
    check_task_name(name)
    check_queue(queue)
    if (
        not isinstance(max_attempts, int)
        or isinstance(max_attempts, bool)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ValidationError(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}"
        )
    for backoff in (backoff_base, backoff_max):
        if not isinstance(backoff, int | float) or not 0 <= backoff < math.inf:
            raise ValidationError(f"backoff must be a finite number >= 0, got {backoff!r}")
    return EnvelopeTemplate(name, queue, max_attempts, float(backoff_base), float(backoff_max))


_cached_template = functools.lru_cache(maxsize=4096, typed=True)(_checked_template)


def make_envelope(
    *,
    name: str,
    queue: str,
    tenant: str,
    args: Any = (),
    kwargs: Any = None,
    task_id: UUID | None = None,
    cost: float = 1.0,
    max_attempts: int = 3,
    backoff_base: float = 1.0,
    backoff_max: float = 3600.0,
    eta: datetime | None = None,
    max_payload_bytes: int = 256 * 1024,
    now: datetime | None = None,
) -> TaskEnvelope:
    """Checks a task and builds its envelope; raises a ValidationError subclass."""
    template = envelope_template(name, queue, max_attempts, backoff_base, backoff_max)
    return template.build(tenant, args, kwargs, task_id, cost, eta, max_payload_bytes, now)


def parse_envelope(raw: bytes | str | dict[str, Any], max_payload_bytes: int) -> TaskEnvelope:
    """Validates an untrusted envelope (JSON text, or decoded JSON); raises
    ValidationError saying what was wrong."""
    try:
        if isinstance(raw, dict):
            envelope = _ENVELOPE.validate_python(raw)
        else:
            envelope = _ENVELOPE.validate_json(raw)
    except PydanticValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ValidationError(f"malformed task envelope: {problems}") from None
    _check_payload(envelope, max_payload_bytes)
    return envelope


def parse_envelopes(raw: bytes, max_payload_bytes: int) -> list[TaskEnvelope] | None:
    """Validates a JSON list of untrusted envelopes in one pass (about half the
    cost of one envelope at a time); None if any of them is invalid, for the
    caller to find which with `parse_envelope`."""
    try:
        envelopes = _ENVELOPES.validate_json(raw)
        for envelope in envelopes:
            _check_payload(envelope, max_payload_bytes)
    except (PydanticValidationError, ValidationError):
        return None
    return envelopes


def _check_payload(envelope: TaskEnvelope, max_payload_bytes: int) -> None:
    try:
        decoded = orjson.loads(envelope.payload)
    except orjson.JSONDecodeError as exc:
        raise NotJSONSerializable(f"payload is not JSON: {exc}") from None
    if not isinstance(decoded, dict) or set(decoded) != {"args", "kwargs"}:
        raise ValidationError("payload must be a JSON object with exactly 'args' and 'kwargs'")
    size = len(envelope.payload.encode())
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes, over the cap of {max_payload_bytes}")
