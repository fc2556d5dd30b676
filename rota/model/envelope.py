"""The task envelope: one task, whole, as it is loaded into PostgreSQL, and the
form a single task takes in a dead letter or an import; its id, its payload.

The checks are rota.model.rules' everywhere: `check_run` and `envelope_template`
for tasks built here (the SDK), `parse_envelope` (pydantic, with field types
built from the same rules) for untrusted ones. The buffer's entry format,
which carries many tasks, is rota.buffer.entries.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID, SafeUUID

import orjson
import uuid_utils
from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
)
from pydantic import ValidationError as PydanticValidationError

from rota.errors import NotJSONSerializable, PayloadTooLarge, ValidationError
from rota.model.rules import (
    LIMIT_KEY_PATTERN,
    MAX_ATTEMPTS,
    MAX_COST,
    MAX_DELAY_SECONDS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    QUEUE_PATTERN,
    RESULT_TTL_MAX,
    TASK_NAME_MAX,
    TASK_PATTERN,
    TENANT_PATTERN,
    check_cost,
    check_delay,
    check_json_integers,
    check_limit_key,
    check_max_attempts,
    check_priority,
    check_queue,
    check_task_name,
    check_tenant,
    check_time,
)

ENVELOPE_VERSION: Literal[1] = 1


def _in_time_range(value: datetime) -> datetime:
    try:
        return check_time("time", value)
    except ValidationError as exc:
        raise ValueError(str(exc)) from None


# Field types for untrusted JSON (buffer entries, dead letters, imports), built
# from the rules' constants. Numbers are strict: "5" is not a number.
QueueName = Annotated[str, StringConstraints(pattern=f"^{QUEUE_PATTERN}$")]
TenantName = Annotated[str, StringConstraints(pattern=f"^{TENANT_PATTERN}$")]
TaskName = Annotated[str, StringConstraints(pattern=f"^{TASK_PATTERN}$", max_length=TASK_NAME_MAX)]
Cost = Annotated[float, Field(gt=0, le=MAX_COST, allow_inf_nan=False, strict=True)]
Attempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS, strict=True)]
Backoff = Annotated[float, Field(ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False, strict=True)]
Priority = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)]
LimitKey = Annotated[str, StringConstraints(pattern=f"^{LIMIT_KEY_PATTERN}$")]
Time = Annotated[AwareDatetime, AfterValidator(_in_time_range)]

_JSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


_dumps = orjson.dumps
_loads = orjson.loads


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


def dump_payload(args: Any, kwargs: Any, max_bytes: int) -> str:
    """Serialises a task's arguments as JSON text, refusing what JSON cannot hold."""
    # Exact types first (a producer's every call): orjson writes a list or a
    # tuple as it is; a subclass (a namedtuple, say) goes as a plain list.
    if type(args) is not list and type(args) is not tuple:
        if not isinstance(args, list | tuple):
            raise NotJSONSerializable(f"args must be a list, got {type(args).__name__}")
        args = list(args)
    if not isinstance(kwargs, dict):
        raise NotJSONSerializable(f"kwargs must be a dict, got {type(kwargs).__name__}")
    payload = {"args": args, "kwargs": kwargs}
    try:
        data = _dumps(payload, default=_refuse, option=_JSON_OPTIONS)
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


def dump_result(value: Any, max_bytes: int) -> tuple[str | None, str | None]:
    """A task's return value as JSON text, or why it cannot be kept (not
    JSON, or over `max_bytes`): (json, None) or (None, reason)."""
    try:
        data = _dumps(value, default=_refuse, option=_JSON_OPTIONS)
        if b"null" in data:
            json.dumps(value, allow_nan=False)  # NaN and infinities: orjson writes null
    except (TypeError, ValueError) as exc:
        return None, f"the result is not JSON: {exc}"
    if len(data) > max_bytes:
        return None, (
            f"the result is {len(data)} bytes of JSON, over ROTA_MAX_RESULT_BYTES ({max_bytes})"
        )
    return data.decode(), None


_SAFE_UNKNOWN = SafeUUID.unknown


def uuid_of_int(value: int) -> UUID:
    """A stdlib UUID of a 128-bit int known to be one, set on its two slots
    without UUID()'s checks (tests/unit/test_envelope.py pins it to UUID(int=)):
    a producer makes one per task. uuid_utils.compat.uuid7() does the same but
    looks the SafeUUID member up through the enum on every call, which made
    minting an id 2.5 times as dear."""
    task_id = _new_object(UUID)
    _set_slot(task_id, "int", value)
    _set_slot(task_id, "is_safe", _SAFE_UNKNOWN)
    return task_id


_new_object = object.__new__
_set_slot = object.__setattr__
_uuid7 = uuid_utils.uuid7


def new_task_id() -> UUID:
    """A time-ordered UUIDv7: ids sort by creation, and index inserts stay local."""
    return uuid_of_int(_uuid7().int)


def task_id_for_key(idempotency_key: str, tenant: str) -> UUID:
    """The same key (per tenant) always names the same task: a second enqueue is
    a no-op. The id hashes the JSON `[tenant, key]`, which no two different
    pairs share (a tenant name may contain ':', a key anything)."""
    name = orjson.dumps([tenant, idempotency_key]).decode()
    return UUID(bytes=uuid_utils.uuid5(uuid_utils.NAMESPACE_URL, f"rota:{name}").bytes)


@dataclass(slots=True)
class TaskEnvelope:
    """One task, whole: what is loaded into PostgreSQL, and the form a single
    task takes in a dead letter or an import. Field names are its JSON keys.

    A plain dataclass (orjson writes dataclasses natively); untrusted ones are
    validated with pydantic (`parse_envelope`), using the constraints annotated
    here. Treat it as immutable (it is not frozen: a producer and a loader
    make one per task, and a frozen dataclass's __init__ is slower)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    id: UUID
    queue: QueueName
    tenant: TenantName
    name: TaskName
    payload: str
    enqueued_at: Time
    cost: Cost = 1.0
    max_attempts: Attempts = 3
    backoff_base: Backoff = 1.0
    backoff_max: Backoff = 3600.0
    eta: Time | None = None
    # Within its tenant only (docs/explanation/architecture.md, "Fairness"); absent means 0.
    priority: Priority = 0
    # The key of a limit it counts against (rota.Limit); absent means none.
    limit_key: LimitKey | None = None
    v: Literal[1] = ENVELOPE_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(self)


_ENVELOPE = TypeAdapter(TaskEnvelope)


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

    def as_row(self) -> tuple[str, str, int, float, float]:
        return (self.name, self.queue, self.max_attempts, self.backoff_base, self.backoff_max)


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
    check_max_attempts(max_attempts)
    return EnvelopeTemplate(
        name,
        queue,
        max_attempts,
        check_delay("backoff", backoff_base),
        check_delay("backoff_max", backoff_max),
    )


_cached_template = functools.lru_cache(maxsize=4096, typed=True)(_checked_template)


def check_run(
    tenant: Any,
    cost: Any = 1.0,
    eta: Any = None,
    args: Any = (),
    kwargs: Any = None,
    max_payload_bytes: int = 256 * 1024,
) -> tuple[str, float, datetime | None, str]:
    """Checks what one run of a task carries of its own; returns (tenant,
    cost, eta, payload JSON) or raises a ValidationError subclass."""
    check_tenant(tenant)
    cost = check_cost(cost)
    if eta is not None:
        check_time("eta", eta)
    payload = dump_payload(args, {} if kwargs is None else kwargs, max_payload_bytes)
    return tenant, cost, eta, payload


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
    priority: int = 0,
    limit_key: str | None = None,
) -> TaskEnvelope:
    """Checks one task and builds its envelope; raises a ValidationError subclass."""
    t = envelope_template(name, queue, max_attempts, backoff_base, backoff_max)
    tenant, cost, eta, payload = check_run(tenant, cost, eta, args, kwargs, max_payload_bytes)
    return TaskEnvelope(
        task_id or new_task_id(),
        t.queue,
        tenant,
        t.name,
        payload,
        now or datetime.now(UTC),
        cost,
        t.max_attempts,
        t.backoff_base,
        t.backoff_max,
        eta,
        check_priority(priority),
        None if limit_key is None else check_limit_key(limit_key),
    )


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
    check_payload(envelope.payload, max_payload_bytes)
    return envelope


_PAYLOAD_KEYS = frozenset(("args", "kwargs"))  # compared with, not built, per task
_OPTIONAL_KEYS = frozenset(("trace", "keep"))


def _traced(keys: Any, decoded: dict[str, Any]) -> bool:
    """A payload with, beside `args` and `kwargs`, a W3C trace context
    (`trace`, rota.runtime.tracing) or a result to keep for its join (`keep`,
    seconds: rota.workflow)."""
    if not keys >= _PAYLOAD_KEYS or not keys - _PAYLOAD_KEYS <= _OPTIONAL_KEYS:
        return False
    trace, keep = decoded.get("trace", {}), decoded.get("keep", 1)
    return (
        type(trace) is dict
        and all(type(k) is str and type(v) is str for k, v in trace.items())
        and type(keep) in (int, float)
        and 0 < keep <= RESULT_TTL_MAX
    )


def check_payload(payload: str, max_payload_bytes: int) -> None:
    """A stored payload is a JSON object of exactly `args` and `kwargs`, within the cap."""
    raw = payload.encode()
    if len(raw) > max_payload_bytes:  # before parsing it
        raise PayloadTooLarge(f"payload is {len(raw)} bytes, over the cap of {max_payload_bytes}")
    try:
        decoded = _loads(raw)
    except orjson.JSONDecodeError as exc:
        raise NotJSONSerializable(f"payload is not JSON: {exc}") from None
    if type(decoded) is not dict or (
        decoded.keys() != _PAYLOAD_KEYS and not _traced(decoded.keys(), decoded)
    ):
        raise ValidationError(
            "payload must be a JSON object of exactly 'args' and 'kwargs', and optionally "
            "'trace' (an object of strings) and 'keep' (seconds)"
        )
    check_json_integers(raw)
