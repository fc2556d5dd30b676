"""The worker's reporting logic (rota.consumer.reports), driven by a fake
database that answers each named statement as a test tells it, with rows of
named columns (built as the real driver builds them)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from rota import core
from rota.consumer.reports import (
    UnknownTaskPolicy,
    Unreported,
    report,
    unreadable_claim,
)
from rota.core.db import Execute, Op
from rota.core.effects import drive
from rota.sql import queries

NAME_OF = {text: name for name, text in queries().items()}
POLICY = UnknownTaskPolicy(retry_seconds=5.0, grace_seconds=600.0)

Answer = Callable[[dict[str, Any]], list[dict[str, Any]]]


class FakeDatabase:
    """Answers Execute steps by block name; records what ran."""

    def __init__(self, **answers: Answer) -> None:
        self.answers = answers
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, step: Any) -> list[Any]:
        assert isinstance(step, Execute)
        name = NAME_OF[step.query]
        params = dict(step.params or {})  # type: ignore[arg-type]
        self.ran.append((name, params))
        rows = self.answers[name](params)
        if not rows or step.rows is None:
            return [tuple(row.values()) for row in rows]
        return step.rows.build(list(rows[0]), [tuple(row.values()) for row in rows])

    def run(self, op: Op[Any]) -> Any:
        return drive(op, self)

    def names(self) -> list[str]:
        return [name for name, _ in self.ran]


def tokens(n: int) -> list[tuple[uuid.UUID, int]]:
    return [(uuid.uuid4(), 1) for _ in range(n)]


def accept_all(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": task_id} for task_id in params["ids"]]


def dead(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": task_id, "status": "dead", "run_at": None} for task_id in params["ids"]]


def held(claims: list[tuple[uuid.UUID, int]]) -> Answer:
    return lambda _: [{"task_id": task_id, "attempt": attempt} for task_id, attempt in claims]


def refuse(bad: set[uuid.UUID]) -> Answer:
    """Refuses any statement that carries one of `bad` (as a DataError would)."""

    def answer(params: dict[str, Any]) -> list[dict[str, Any]]:
        if bad & set(params["ids"]):
            raise psycopg.errors.DataError("value out of range")
        return dead(params)

    return answer


def test_a_refused_batch_is_reported_one_at_a_time_and_the_culprit_is_dead() -> None:
    done = tokens(4)
    culprit = done[2][0]
    final_failures: list[uuid.UUID] = []

    def fail(params: dict[str, Any]) -> list[dict[str, Any]]:
        final_failures.extend(
            i for i, final in zip(params["ids"], params["final"], strict=True) if final
        )
        return dead(params)

    def complete(params: dict[str, Any]) -> list[dict[str, Any]]:
        if culprit in params["ids"]:
            raise psycopg.errors.DataError("the row cannot be written")
        return accept_all(params)

    database = FakeDatabase(complete=complete, fail=fail)
    unreported = Unreported(done=list(done))
    assert database.run(report(unreported, POLICY)) == 4
    # One batch, then each task alone: the culprit's own report is refused,
    # and it is failed for good before the next task is reported.
    assert database.names() == ["complete"] * 4 + ["fail", "complete"]
    assert final_failures == [culprit]
    assert not unreported


def test_a_lost_connection_keeps_what_was_not_reported() -> None:
    def lost(params: dict[str, Any]) -> list[dict[str, Any]]:
        raise psycopg.OperationalError("server closed the connection")

    failure = core.Failure(uuid.uuid4(), 1, "boom")
    done = tokens(2)
    unreported = Unreported(done=list(done), failed=[failure])
    database = FakeDatabase(complete=accept_all, fail=lost)
    with pytest.raises(psycopg.OperationalError):
        database.run(report(unreported, POLICY))
    # Completions went through and are gone; the failure waits for the next
    # connection, untouched (no one-at-a-time retry of an outage).
    assert unreported.done == [] and unreported.failed == [failure]
    assert database.names() == ["complete", "fail"]

    again = FakeDatabase(fail=refuse(set()))
    assert again.run(report(unreported, POLICY)) == 1
    assert not unreported


def test_stale_and_unknown_tasks_are_handed_back_without_using_an_attempt() -> None:
    stale, unknown = tokens(2), tokens(1)
    seen: dict[str, dict[str, Any]] = {}

    def record(name: str, answer: Answer) -> Answer:
        def recorded(params: dict[str, Any]) -> list[dict[str, Any]]:
            seen[name] = params
            return answer(params)

        return recorded

    def scheduled(params: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"id": task_id, "status": "scheduled"} for task_id in params["ids"]]

    database = FakeDatabase(
        requeue=record("requeue", accept_all), defer_unknown=record("defer_unknown", scheduled)
    )
    assert database.run(report(Unreported(stale=stale, unknown=unknown), POLICY)) == 0
    assert seen["requeue"]["consume"] is False
    assert list(seen["requeue"]["ids"]) == [t for t, _ in stale]
    assert seen["defer_unknown"]["delay"] == 5.0 and seen["defer_unknown"]["grace"] == 600.0
    assert "ROTA_UNKNOWN_TASK_GRACE_SECONDS" in seen["defer_unknown"]["reason"]


def test_a_task_whose_death_is_refused_too_is_left_to_its_lease() -> None:
    (token,) = tokens(1)
    database = FakeDatabase(fail=refuse({token[0]}))
    unreported = Unreported(failed=[core.Failure(*token, "boom")])
    assert database.run(report(unreported, POLICY)) == 1  # logged, not raised
    assert database.names() == ["fail", "fail"]
    assert not unreported


def test_an_unreadable_claim_of_one_task_kills_that_task() -> None:
    in_hand, (taken,) = tokens(1), tokens(1)
    failed: list[Any] = []

    def fail(params: dict[str, Any]) -> list[dict[str, Any]]:
        failed.append((list(params["ids"]), params["final"], params["errors"]))
        return dead(params)

    database = FakeDatabase(worker_claims=held([*in_hand, taken]), fail=fail)
    error = ValueError("year 10000 is out of range")
    assert database.run(unreadable_claim("w1", {in_hand[0][0]}, error)) == 0
    ((ids, final, errors),) = failed
    assert ids == [taken[0]] and final == [True]
    assert "could not be read" in errors[0] and "year 10000" in errors[0]


def test_an_unreadable_claim_of_several_hands_them_back_to_single_the_culprit_out() -> None:
    taken = tokens(3)
    database = FakeDatabase(worker_claims=held(taken), requeue=accept_all)
    assert database.run(unreadable_claim("w1", set(), ValueError("bad row"))) == 3
    assert database.names() == ["worker_claims", "requeue"]
    assert database.ran[1][1]["consume"] is False


def test_completions_carry_each_runs_measures_even_one_at_a_time() -> None:
    done = tokens(3)
    culprit = done[1][0]
    runs = {task_id: (0.5 + n, 0.05 * (n + 1)) for n, (task_id, _) in enumerate(done)}
    sent: dict[uuid.UUID, tuple[float, float]] = {}

    def complete(params: dict[str, Any]) -> list[dict[str, Any]]:
        if len(params["ids"]) > 1 and culprit in params["ids"]:
            raise psycopg.errors.DataError("the row cannot be written")
        sent.update(
            (i, (s, r))
            for i, s, r in zip(params["ids"], params["started"], params["ran"], strict=True)
        )
        return accept_all(params)

    database = FakeDatabase(complete=complete, fail=dead)
    unreported = Unreported(done=list(done), runs=dict(runs))
    assert database.run(report(unreported, POLICY)) == 3
    # The batch refused, each task went alone, with its own measures.
    assert sent == runs
    assert unreported.runs == {}  # reported, forgotten
