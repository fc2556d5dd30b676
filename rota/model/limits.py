"""Limits on keys other than the tenant (docs/howto/limits.md): a task names a
key, and the key's limit caps how many of its tasks run at once and how
fast they start, over every tenant.

    stripe = rota.Limit("stripe", concurrency=5, rate=20)
    per_pair = rota.Limit("reports", per="{tenant}:{task}", concurrency=2)

    @app.task(limit=stripe)
    def charge(customer: str, cents: int) -> None: ...

A task's key is the limit's name (`stripe`), or with `per` the name and the
template filled in (`reports/acme:render`): one key, and one count, per
value. Templates name `tenant`, `task` and the task function's parameters.
"""

from __future__ import annotations

import inspect
import string
from dataclasses import dataclass, field
from typing import Any

from rota.errors import ValidationError
from rota.model.rules import (
    LIMIT_KEY_VALUE_MAX,
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_BURST,
    MAX_RATE_LIMIT,
    check_limit_key,
    check_limit_name,
    check_number,
)

# Fields every template may name beside the function's parameters.
_CALL_FIELDS = frozenset({"tenant", "task"})


@dataclass(frozen=True)
class Limit:
    """A limit on keys: at most `concurrency` of a key's tasks running at
    once, and at most `rate` starts per second (bursts of `burst`), whatever
    their tenants. Without numbers, an operator sets them
    (`rota limit set NAME`); with them, the app's workers declare them at
    start (an operator's setting stays until `rota limit reset NAME`)."""

    name: str
    concurrency: int | None = None
    rate: float | None = None
    burst: float | None = None
    # The key's value, made of each run: "{tenant}", "{tenant}:{task}",
    # "{customer_id}" (an argument of the task), ...
    per: str | None = None
    _fields: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_limit_name(self.name)
        if self.concurrency is not None:
            check_number("concurrency", self.concurrency, 0, MAX_CONCURRENCY_LIMIT, integer=True)
        if self.rate is not None:
            check_number("rate", self.rate, 0, MAX_RATE_LIMIT, low_open=True)
        if self.burst is not None:
            if self.rate is None:
                raise ValidationError("burst= needs rate=")
            check_number("burst", self.burst, 1, MAX_RATE_BURST)
        if self.per is not None:
            object.__setattr__(self, "_fields", _template_fields(self.per))

    @property
    def declared(self) -> bool:
        """Whether the code sets its numbers (else an operator does)."""
        return self.concurrency is not None or self.rate is not None

    def check_fits(self, task: str, signature: inspect.Signature) -> None:
        """Refuses, at registration, a template naming what the task lacks."""
        parameters = signature.parameters
        unknown = [f for f in self._fields if f not in _CALL_FIELDS and f not in parameters]
        if unknown:
            raise ValidationError(
                f"limit {self.name!r} of task {task!r}: per={self.per!r} names "
                f"{', '.join(map(repr, unknown))}, which is not tenant, task or a parameter"
            )

    def key(
        self,
        tenant: str,
        task: str,
        signature: inspect.Signature,
        args: Any,
        kwargs: dict[str, Any],
    ) -> str:
        """The key of one run; raises ValidationError if it cannot be made."""
        if self.per is None:
            return self.name
        values: dict[str, Any] = {"tenant": tenant, "task": task}
        if any(f not in _CALL_FIELDS for f in self._fields):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise ValidationError(f"arguments do not fit task {task!r}: {exc}") from None
            bound.apply_defaults()
            values.update(bound.arguments)
        value = self.per.format_map(values)
        if not 1 <= len(value) <= LIMIT_KEY_VALUE_MAX:
            raise ValidationError(
                f"limit {self.name!r}: the key's value must be 1-{LIMIT_KEY_VALUE_MAX} "
                f"characters, got {len(value)}"
            )
        return check_limit_key(f"{self.name}/{value}")


def _template_fields(per: Any) -> tuple[str, ...]:
    if type(per) is not str or not per:
        raise ValidationError(f"per= must be a template such as '{{tenant}}', got {per!r}")
    try:
        parsed = list(string.Formatter().parse(per))
    except ValueError as exc:
        raise ValidationError(f"per={per!r} is not a template: {exc}") from None
    fields = tuple(name for _, name, _, _ in parsed if name is not None)
    if not fields or any(not f.isidentifier() for f in fields):
        raise ValidationError(
            f"per={per!r} must name fields ({{tenant}}, {{task}} or parameters), plainly"
        )
    return fields
