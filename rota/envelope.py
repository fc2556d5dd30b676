"""Tasks on the wire: a batch's columns in the buffer, one envelope per task loaded.

One set of rules for every path in: the producer checks tasks as it adds them
to a `TaskBatch` (fast, no model per task), the loader validates buffer
entries with `parse_batch` and single tasks with `parse_envelope` (pydantic,
with the same constraints), and both check names and payloads the same way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
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
    with_config,
)
from pydantic import ValidationError as PydanticValidationError
from typing_extensions import TypedDict

from rota.errors import NotJSONSerializable, PayloadTooLarge, ValidationError
from rota.rules import (
    MAX_ATTEMPTS,
    MAX_COST,
    MAX_DELAY_SECONDS,
    QUEUE_PATTERN,
    TASK_NAME_MAX,
    TASK_PATTERN,
    TENANT_PATTERN,
    check_cost,
    check_delay,
    check_json_integers,
    check_max_attempts,
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
Time = Annotated[AwareDatetime, AfterValidator(_in_time_range)]

_JSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


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


def _uuid_of_int(value: int) -> UUID:
    """A stdlib UUID from a 128-bit int already known to be one, without
    UUID()'s checks: the producer and the loader make one per task."""
    task_id = object.__new__(UUID)
    object.__setattr__(task_id, "int", value)
    object.__setattr__(task_id, "is_safe", _SAFE_UNKNOWN)
    return task_id


def new_task_id() -> UUID:
    """A time-ordered UUIDv7: ids sort by creation, and index inserts stay local."""
    # uuid_utils.compat.uuid7() builds the stdlib UUID the same way, but looks the
    # enum member up on every call: this takes half the time (0.9 vs 1.7 µs),
    # on the producer's per-task path.
    return _uuid_of_int(uuid_utils.uuid7().int)


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
    here. Treat it as immutable (not frozen: that costs 2 µs a task)."""

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

# A batch's per-task columns, in the JSON of a buffer entry.
TASK_COLUMNS = ("template", "id", "tenant", "payload", "cost", "eta")
ENTRY_KEYS = frozenset({"enqueued_at", "templates", *TASK_COLUMNS})


@dataclass(slots=True)
class TaskBatch:
    """Checked tasks, column by column: what the producer stores, and the JSON
    of a buffer entry (`to_json`). The tasks share one enqueue time; each
    names its template (name, queue, retry policy) by index, so that a
    template is written, and checked by the loader, once per entry instead of
    once per task. Column order is enqueue order."""

    enqueued_at: datetime
    templates: list[EnvelopeTemplate] = field(default_factory=list)
    template: list[int] = field(default_factory=list)
    ids: list[UUID] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    etas: list[datetime | None] = field(default_factory=list)
    _last: tuple[EnvelopeTemplate | None, int] = field(default=(None, -1), repr=False)
    _index: dict[EnvelopeTemplate, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls) -> TaskBatch:
        return cls(datetime.now(UTC))

    def add(
        self,
        template: EnvelopeTemplate,
        tenant: str,
        args: Any = (),
        kwargs: Any = None,
        task_id: UUID | None = None,
        cost: float = 1.0,
        eta: datetime | None = None,
        max_payload_bytes: int = 256 * 1024,
    ) -> UUID:
        """Checks one run of `template` and appends it (nothing, if it raises a
        ValidationError subclass); returns its task id."""
        check_tenant(tenant)
        cost = check_cost(cost)
        if eta is not None:
            check_time("eta", eta)
        payload = dump_payload(args, {} if kwargs is None else kwargs, max_payload_bytes)
        last, index = self._last
        if template is not last:
            index = self._index_of(template)
            self._last = (template, index)
        task_id = task_id or new_task_id()
        self.template.append(index)
        self.ids.append(task_id)
        self.tenants.append(tenant)
        self.payloads.append(payload)
        self.costs.append(cost)
        self.etas.append(eta)
        return task_id

    def _index_of(self, template: EnvelopeTemplate) -> int:
        index = self._index
        if len(index) != len(self.templates):  # a batch built from its columns
            index.clear()
            index.update((known, i) for i, known in enumerate(self.templates))
        found = index.get(template)
        if found is None:
            found = index[template] = len(self.templates)
            self.templates.append(template)
        return found

    def select(self, indices: Sequence[int]) -> TaskBatch:
        """The tasks at `indices`, in that order, with only the templates they use."""
        used, template = _templates_used(self.template, indices)
        return TaskBatch(
            self.enqueued_at,
            [self.templates[i] for i in used],
            template,
            [self.ids[i] for i in indices],
            [self.tenants[i] for i in indices],
            [self.payloads[i] for i in indices],
            [self.costs[i] for i in indices],
            [self.etas[i] for i in indices],
        )

    def envelopes(self) -> list[TaskEnvelope]:
        templates = self.templates
        enqueued_at = self.enqueued_at
        envelopes = []
        for index, task_id, tenant, payload, cost, eta in zip(
            self.template, self.ids, self.tenants, self.payloads, self.costs, self.etas, strict=True
        ):
            t = templates[index]
            envelopes.append(
                TaskEnvelope(
                    task_id,
                    t.queue,
                    tenant,
                    t.name,
                    payload,
                    enqueued_at,
                    cost,
                    t.max_attempts,
                    t.backoff_base,
                    t.backoff_max,
                    eta,
                )
            )
        return envelopes

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "enqueued_at": self.enqueued_at,
                "templates": [t.as_row() for t in self.templates],
                "template": self.template,
                "id": self.ids,
                "tenant": self.tenants,
                "payload": self.payloads,
                "cost": self.costs,
                "eta": self.etas,
            }
        )

    @classmethod
    def from_checked_json(cls, raw: str | bytes) -> TaskBatch:
        """Rebuilds a batch that was validated, then written by `to_json` (the
        Spark executors check entries, the driver only rebuilds them)."""
        d = orjson.loads(raw)
        return cls(
            datetime.fromisoformat(d["enqueued_at"]),
            [EnvelopeTemplate(*row) for row in d["templates"]],
            d["template"],
            # Checked ids in their canonical form: skips UUID()'s parsing (0.7 vs 1.2 µs).
            [_uuid_of_int(int(i.replace("-", ""), 16)) for i in d["id"]],
            d["tenant"],
            d["payload"],
            d["cost"],
            [datetime.fromisoformat(e) if e else None for e in d["eta"]],
        )


def _templates_used(template: Sequence[int], indices: Sequence[int]) -> tuple[list[int], list[int]]:
    """For the tasks at `indices`: the templates they use (old indexes, in
    order), and their template column renumbered to that list."""
    used = sorted({template[i] for i in indices})
    renumber = {old: new for new, old in enumerate(used)}
    return used, [renumber[template[i]] for i in indices]


def _check_same_length(columns: Sequence[Sized]) -> None:
    if len({len(column) for column in columns}) > 1:
        raise ValidationError("the entry's task columns differ in length")


@with_config(ConfigDict(extra="forbid"))
class _EntryColumns(TypedDict):
    """What `TaskBatch.to_json` writes, as pydantic validates it."""

    enqueued_at: Time
    templates: list[tuple[TaskName, QueueName, Attempts, Backoff, Backoff]]
    template: list[Annotated[int, Field(ge=0, strict=True)]]
    id: list[UUID]
    tenant: list[TenantName]
    payload: list[str]
    cost: list[Cost]
    eta: list[Time | None]


_ENTRY = TypeAdapter(_EntryColumns)


def parse_batch(
    raw: bytes | str, max_payload_bytes: int
) -> tuple[TaskBatch, list[tuple[bytes, str]]]:
    """Validates an untrusted batch (a buffer entry's JSON): the valid tasks,
    and each invalid one (as a whole task's JSON) with the reason. Raises
    ValidationError when the entry as a whole is malformed."""
    try:
        batch = _validated_batch(_ENTRY.validate_json(raw), max_payload_bytes)
    except (PydanticValidationError, ValidationError):
        return _parse_task_by_task(raw, max_payload_bytes)
    return batch, []


def _validated_batch(columns: _EntryColumns, max_payload_bytes: int) -> TaskBatch:
    _check_same_length([columns[key] for key in TASK_COLUMNS])  # type: ignore[literal-required]
    templates = [EnvelopeTemplate(*row) for row in columns["templates"]]
    if any(index >= len(templates) for index in columns["template"]):
        raise ValidationError("a task names a template the entry does not have")
    for payload in columns["payload"]:
        check_payload(payload, max_payload_bytes)
    return TaskBatch(
        columns["enqueued_at"],
        templates,
        columns["template"],
        columns["id"],
        columns["tenant"],
        columns["payload"],
        columns["cost"],
        columns["eta"],
    )


def _parse_task_by_task(
    raw: bytes | str, max_payload_bytes: int
) -> tuple[TaskBatch, list[tuple[bytes, str]]]:
    """Something in the entry is invalid: checks each task whole, to tell
    which and why; the entry fails as a whole only if its shape is wrong."""
    try:
        columns = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"entry is not JSON: {exc}") from None
    if not isinstance(columns, dict) or set(columns) != ENTRY_KEYS:
        raise ValidationError(f"entry must be a JSON object with the keys {sorted(ENTRY_KEYS)}")
    templates = columns["templates"]
    if not isinstance(templates, list) or not all(
        isinstance(columns[key], list) for key in TASK_COLUMNS
    ):
        raise ValidationError("the entry's templates and task columns must be JSON lists")
    _check_same_length([columns[key] for key in TASK_COLUMNS])
    good: list[int] = []
    bad: list[tuple[bytes, str]] = []
    for i in range(len(columns["id"])):
        index = columns["template"][i]
        template = templates[index] if type(index) is int and 0 <= index < len(templates) else None
        if not isinstance(template, list) or len(template) != 5:
            task = {key: columns[key][i] for key in TASK_COLUMNS}
            bad.append((orjson.dumps(task), f"task names no valid template: {index!r:.40}"))
            continue
        task = {
            "id": columns["id"][i],
            "queue": template[1],
            "tenant": columns["tenant"][i],
            "name": template[0],
            "payload": columns["payload"][i],
            "enqueued_at": columns["enqueued_at"],
            "cost": columns["cost"][i],
            "max_attempts": template[2],
            "backoff_base": template[3],
            "backoff_max": template[4],
            "eta": columns["eta"][i],
        }
        try:
            parse_envelope(task, max_payload_bytes)
        except ValidationError as exc:
            bad.append((orjson.dumps(task), str(exc)))
        else:
            good.append(i)
    if not good:
        return TaskBatch.empty(), bad
    used, template = _templates_used(columns["template"], good)
    kept = {
        "enqueued_at": columns["enqueued_at"],
        "templates": [templates[i] for i in used],
        **{key: [columns[key][i] for i in good] for key in TASK_COLUMNS},
        "template": template,
    }
    try:
        return _validated_batch(_ENTRY.validate_python(kept), max_payload_bytes), bad
    except PydanticValidationError as exc:  # each task passed: the rules disagree
        raise ValidationError(f"malformed entry: {exc}") from None


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
    """Checks one task and builds its envelope; raises a ValidationError subclass."""
    batch = TaskBatch(now or datetime.now(UTC))
    template = envelope_template(name, queue, max_attempts, backoff_base, backoff_max)
    batch.add(template, tenant, args, kwargs, task_id, cost, eta, max_payload_bytes)
    return batch.envelopes()[0]


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


def check_payload(payload: str, max_payload_bytes: int) -> None:
    """A stored payload is a JSON object of exactly `args` and `kwargs`, within the cap."""
    try:
        decoded = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise NotJSONSerializable(f"payload is not JSON: {exc}") from None
    if not isinstance(decoded, dict) or set(decoded) != {"args", "kwargs"}:
        raise ValidationError("payload must be a JSON object with exactly 'args' and 'kwargs'")
    size = len(payload.encode())
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes, over the cap of {max_payload_bytes}")
    check_json_integers(payload)
