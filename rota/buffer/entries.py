"""The buffer's entry format: a batch of tasks, column by column, as the JSON
of one Redis stream entry (rota.buffer.streams stores the entries)."""

from __future__ import annotations

from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, NotRequired
from uuid import UUID

import orjson
from pydantic import ConfigDict, Field, TypeAdapter, with_config
from pydantic import ValidationError as PydanticValidationError
from typing_extensions import TypedDict

from rota.errors import ValidationError
from rota.model.calls import CheckedRun, run_of
from rota.model.envelope import (
    Attempts,
    Backoff,
    Cost,
    EnvelopeTemplate,
    LimitKey,
    Priority,
    QueueName,
    TaskEnvelope,
    TaskName,
    TenantName,
    Time,
    check_payload,
    new_task_id,
    parse_envelope,
)

# A batch's per-task columns, in the JSON of a buffer entry. The optional
# ones are written only when a task has one: an entry without "priority"
# means 0 for all, without "limit_key" no key for any (as entries written
# before them).
TASK_COLUMNS = ("template", "id", "tenant", "payload", "cost", "eta")
ENTRY_KEYS = frozenset({"enqueued_at", "templates", *TASK_COLUMNS})
PRIORITY = "priority"
LIMIT_KEY = "limit_key"
OPTIONAL_COLUMNS = (PRIORITY, LIMIT_KEY)


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
    priorities: list[int] = field(default_factory=list)
    limit_keys: list[str | None] = field(default_factory=list)
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
        priority: int = 0,
        limit_key: str | None = None,
    ) -> UUID:
        """Checks one run of `template` and appends it (nothing, if it raises a
        ValidationError subclass); returns its task id."""
        return self.append(
            run_of(
                template,
                tenant,
                args,
                kwargs,
                task_id,
                cost,
                eta,
                max_payload_bytes,
                priority,
                limit_key,
            )
        )

    def append(self, run: CheckedRun) -> UUID:
        """Appends a checked run (rota.model.calls); returns its task id."""
        template, tenant, payload, task_id, cost, eta, priority, limit_key = run
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
        self.priorities.append(priority)
        self.limit_keys.append(limit_key)
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
            [self.priorities[i] for i in indices],
            [self.limit_keys[i] for i in indices],
        )

    def envelopes(self) -> list[TaskEnvelope]:
        templates = self.templates
        enqueued_at = self.enqueued_at
        envelopes = []
        for index, task_id, tenant, payload, cost, eta, priority, limit_key in zip(
            self.template,
            self.ids,
            self.tenants,
            self.payloads,
            self.costs,
            self.etas,
            self.priorities,
            self.limit_keys,
            strict=True,
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
                    priority,
                    limit_key,
                )
            )
        return envelopes

    def to_json(self) -> bytes:
        columns: dict[str, Any] = {
            "enqueued_at": self.enqueued_at,
            "templates": [t.as_row() for t in self.templates],
            "template": self.template,
            "id": self.ids,
            "tenant": self.tenants,
            "payload": self.payloads,
            "cost": self.costs,
            "eta": self.etas,
        }
        if any(self.priorities):  # else left out: every task is at 0
            columns[PRIORITY] = self.priorities
        if any(self.limit_keys):  # else left out: no task has a key
            columns[LIMIT_KEY] = self.limit_keys
        return orjson.dumps(columns)

    @classmethod
    def from_checked_json(cls, raw: str | bytes) -> TaskBatch:
        """Rebuilds a batch that was validated, then written by `to_json` (the
        Spark executors check entries, the driver only rebuilds them)."""
        d = orjson.loads(raw)
        return cls(
            datetime.fromisoformat(d["enqueued_at"]),
            [EnvelopeTemplate(*row) for row in d["templates"]],
            d["template"],
            [UUID(i) for i in d["id"]],
            d["tenant"],
            d["payload"],
            d["cost"],
            [datetime.fromisoformat(e) if e else None for e in d["eta"]],
            d.get(PRIORITY) or [0] * len(d["id"]),
            d.get(LIMIT_KEY) or [None] * len(d["id"]),
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
    priority: NotRequired[list[Priority]]
    limit_key: NotRequired[list[LimitKey | None]]


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
    priorities = columns.get("priority") or [0] * len(columns["id"])
    limit_keys = columns.get("limit_key") or [None] * len(columns["id"])
    _check_same_length([*(columns[key] for key in TASK_COLUMNS), priorities, limit_keys])  # type: ignore[literal-required]
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
        priorities,
        limit_keys,
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
    if not isinstance(columns, dict) or set(columns) - set(OPTIONAL_COLUMNS) != ENTRY_KEYS:
        raise ValidationError(
            f"entry must be a JSON object with the keys {sorted(ENTRY_KEYS)} (and optionally "
            f"{', '.join(map(repr, OPTIONAL_COLUMNS))})"
        )
    templates = columns["templates"]
    keys = (*TASK_COLUMNS, *(key for key in OPTIONAL_COLUMNS if key in columns))
    if not isinstance(templates, list) or not all(isinstance(columns[key], list) for key in keys):
        raise ValidationError("the entry's templates and task columns must be JSON lists")
    _check_same_length([columns[key] for key in keys])
    good: list[int] = []
    bad: list[tuple[bytes, str]] = []
    for i in range(len(columns["id"])):
        index = columns["template"][i]
        template = templates[index] if type(index) is int and 0 <= index < len(templates) else None
        if not isinstance(template, list) or len(template) != 5:
            task = {key: columns[key][i] for key in keys}
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
            **{key: columns[key][i] for key in OPTIONAL_COLUMNS if key in columns},
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
        **{key: [columns[key][i] for i in good] for key in keys},
        "template": template,
    }
    try:
        return _validated_batch(_ENTRY.validate_python(kept), max_payload_bytes), bad
    except PydanticValidationError as exc:  # each task passed: the rules disagree
        raise ValidationError(f"malformed entry: {exc}") from None
