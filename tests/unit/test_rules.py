"""Bounds and names at every entrance: typed errors, never a crash or a silent default."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rota
from rota.errors import InvalidName, NotJSONSerializable, ValidationError
from rota.model import rules
from rota.model.envelope import check_payload, dump_payload, make_envelope, task_id_for_key
from rota.settings import Settings

SCHEMA = (Path(rules.__file__).parent.parent / "sql" / "schema.sql").read_text()


@pytest.fixture
def app() -> rota.App:
    application = rota.App(Settings(database_url="postgresql://u:pw@nowhere/db"))

    @application.task(queue="pdfs")
    def parse(path: str, pages: int = 1) -> None: ...

    return application


def noop() -> None: ...


def _enqueue_batch(app: rota.App, **options: Any) -> Any:
    """Checks a call as enqueue would (everything but the write)."""
    return app.batch([app.tasks["parse"].using(**{"tenant": "alice", **options}).prepare("a.pdf")])


@pytest.mark.parametrize(
    "options",
    [
        {"countdown": math.nan},
        {"countdown": math.inf},
        {"countdown": -1},
        {"countdown": "5"},
        {"countdown": True},
        {"countdown": rules.MAX_DELAY_SECONDS * 2},
        {"eta": "2030-01-01T00:00:00+00:00"},
        {"eta": date(2030, 1, 1)},
        {"eta": datetime(2030, 1, 1)},
        {"eta": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
        {"eta": datetime(1990, 1, 1, tzinfo=UTC)},
        {"eta": datetime(2030, 1, 1, tzinfo=UTC), "countdown": 5},
        {"cost": "5"},
        {"cost": math.nan},
        {"cost": 0},
        {"cost": 10**20},
        {"idempotency_key": 42},
        {"idempotency_key": ""},
        {"idempotency_key": "k" * 2000},
        {"tenant": "alice\n"},
        {"tenant": "x" * 1_000_000},
        {"tenant": None},
        {"priority": 10},
        {"priority": -1},
        {"priority": 1.0},
        {"priority": "1"},
        {"priority": True},
    ],
)
def test_bad_enqueue_options_get_a_validation_error(app: rota.App, options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _enqueue_batch(app, **options)


def test_good_enqueue_options_pass(app: rota.App) -> None:
    eta = datetime.now(UTC) + timedelta(days=1)
    batch = _enqueue_batch(app, eta=eta, cost=2, idempotency_key="k")
    assert batch.etas == [eta] and batch.costs == [2.0]
    assert _enqueue_batch(app, countdown=0).etas[0] is not None


@pytest.mark.parametrize(
    "options",
    [
        {"backoff": 1e300},
        {"backoff": -1},
        {"backoff_max": math.inf},
        {"backoff": "1"},
        {"timeout": -5},
        {"timeout": 0},
        {"timeout": math.nan},
        {"timeout": rules.MAX_TIMEOUT_SECONDS + 1},
        {"max_attempts": 0},
        {"max_attempts": rules.MAX_ATTEMPTS + 1},
        {"max_attempts": 2.0},
        {"cost": -1},
        {"name": "evil\n"},
        {"name": "x" * 300},
        {"queue": "pdfs\n"},
        {"priority": 10},
        {"priority": -1},
    ],
)
def test_bad_task_declarations_are_refused(app: rota.App, options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        app.task(**options)(noop)
    app.task(name="fine")(noop)  # the same function registers with good options


def test_max_attempts_zero_is_refused_not_silently_three(app: rota.App) -> None:
    with pytest.raises(ValidationError, match="max_attempts"):

        @app.task(max_attempts=0)
        def nope() -> None: ...


@pytest.mark.parametrize(
    "name", ["tenant", "cost", "eta", "countdown", "idempotency_key", "connection", "priority"]
)
def test_parameters_named_like_enqueue_options_are_the_tasks_own(app: rota.App, name: str) -> None:
    """The options go to `using`, the task's arguments to `prepare`: a
    parameter named like an option is declared, and gets its own argument."""
    namespace: dict[str, Any] = {}
    exec(f"def task({name}): ...", namespace)
    task = app.task(name=f"named_{name}")(namespace["task"])
    by_keyword = app.batch([task.using(tenant="a").prepare(**{name: "x"})])
    assert json.loads(by_keyword.payloads[0]) == {"args": [], "kwargs": {name: "x"}}
    assert (by_keyword.tenants, by_keyword.costs, by_keyword.etas) == (["a"], [1.0], [None])
    assert by_keyword.priorities == [0]
    by_position = app.batch([task.using(tenant="a").prepare("x")])
    assert json.loads(by_position.payloads[0]) == {"args": ["x"], "kwargs": {}}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), (("a", 1, 2), {}), (("a",), {"nope": 1}), (("a",), {"path": "b"})],
)
def test_arguments_that_do_not_fit_the_signature_are_refused_at_enqueue(
    app: rota.App, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError, match="arguments do not fit"):
        app.batch([app.tasks["parse"].using(tenant="alice").prepare(*args, **kwargs)])
    app.batch([app.tasks["parse"].using(tenant="alice").prepare("a", 2)])  # fits
    app.batch([app.tasks["parse"].using(tenant="alice").prepare(path="a")])


def test_idempotency_ids_are_per_tenant_unambiguously() -> None:
    assert task_id_for_key("upload-1", "acme:eu") != task_id_for_key("eu:upload-1", "acme")
    assert task_id_for_key("k", "alice") == task_id_for_key("k", "alice")
    assert task_id_for_key("k", "alice") != task_id_for_key("k", "bob")


@pytest.mark.parametrize(
    ("check", "name"),
    [
        (rules.check_queue, "pdfs\n"),
        (rules.check_tenant, "alice\n"),
        (rules.check_task_name, "app.task\n"),
        (rules.check_tenant, "\nalice"),
    ],
)
def test_names_match_whole(check: Any, name: str) -> None:
    with pytest.raises(InvalidName):
        check(name)
    check(name.strip())


def test_rejected_names_are_not_remembered() -> None:
    before = len(rules._TENANT_NAMES.valid)
    for i in range(300):
        with pytest.raises(InvalidName) as caught:
            rules.check_tenant(f"{i}" + "!" * 1_000_000)
        assert len(str(caught.value)) < 400  # the message does not echo a megabyte
    assert len(rules._TENANT_NAMES.valid) == before


@pytest.mark.parametrize(
    "settings",
    [
        {"weight": 0},
        {"weight": math.inf},
        {"concurrency_limit": -1},
        {"concurrency_limit": 2.5},
        {"rate_limit": math.inf},
        {"rate_limit": 0},
        {"rate_limit": "5"},
        {"rate_burst": 0.5},
        {"capacity": 10**20},
        {"capacity": 1e20},
    ],
)
def test_tenant_settings_have_bounds(settings: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        rules.check_tenant_settings(**settings)


def test_integers_past_64_bits_are_refused_both_ways() -> None:
    with pytest.raises(NotJSONSerializable):
        dump_payload([2**70], {}, 1024)
    assert dump_payload([2**63, -(2**63)], {}, 1024)  # 64-bit ones are fine
    with pytest.raises(ValidationError, match="64 bits"):
        check_payload('{"args": [123456789012345678901234567890], "kwargs": {}}', 1024)
    check_payload('{"args": ["1234567890123456789012345"], "kwargs": {}}', 1024)


def test_deep_nesting_is_a_typed_error() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(NotJSONSerializable):
        make_envelope(name="t", queue="q", tenant="a", args=[deep])
    with pytest.raises(ValidationError):
        check_payload('{"args": ' + "[" * 5000 + "]" * 5000 + ', "kwargs": {}}', 10**6)


def test_many_distinct_templates_in_one_batch(app: rota.App) -> None:
    calls = [app.prepare(f"other.t{i}", queue="q", tenant="a") for i in range(5000)]
    batch = app.batch(calls)
    assert batch.template == list(range(5000))
    assert [e.name for e in batch.envelopes()] == [f"other.t{i}" for i in range(5000)]


def _sql(number: float) -> str:
    """A float bound as schema.sql writes it (1e6, 1e-6)."""
    return f"{number:g}".replace("e+0", "e").replace("e-0", "e-")


def test_the_database_checks_are_the_rules() -> None:
    """schema.sql's CHECKs spell the same patterns and bounds as rota/model/rules.py."""
    checks = {
        "queue_name_rule": f"'^{rules.QUEUE_PATTERN}$'",
        "tenant_name_rule": f"'^{rules.TENANT_PATTERN}$'",
        "task_name_rule": f"'^{rules.TASK_PATTERN}$'",
    }
    for constraint, pattern in checks.items():
        text = SCHEMA[SCHEMA.index(constraint) :][:300]
        assert pattern in text, constraint
    assert f"length(name) <= {rules.TASK_NAME_MAX}" in SCHEMA
    assert f"max_attempts <= {rules.MAX_ATTEMPTS}" in SCHEMA
    assert f"backoff_max <= {int(rules.MAX_DELAY_SECONDS)}" in SCHEMA
    assert f"cost <= {_sql(rules.MAX_COST)}" in SCHEMA
    assert (
        f"weight >= {_sql(rules.WEIGHT_RANGE[0])} AND weight <= {_sql(rules.WEIGHT_RANGE[1])}"
        in SCHEMA
    )
    assert f"concurrency_limit <= {rules.MAX_CONCURRENCY_LIMIT}" in SCHEMA
    assert f"rate_limit <= {_sql(rules.MAX_RATE_LIMIT)}" in SCHEMA
    assert f"rate_burst <= {_sql(rules.MAX_RATE_BURST)}" in SCHEMA
    assert f"capacity <= {rules.MAX_CAPACITY}" in SCHEMA
    low, high = rules.PRIORITY_RANGE
    assert f"CHECK (priority >= {low} AND priority <= {high})" in SCHEMA
    for bound in (rules.EARLIEST, rules.LATEST):
        assert SCHEMA.count(f"'{bound:%Y-%m-%d %H:%M:%S}+00'") == 2  # eta and enqueued_at
    # The regexes PostgreSQL applies accept and refuse what Python does.
    assert re.fullmatch(rules.TASK_PATTERN, "app.tasks:run")


def test_settings_never_show_passwords() -> None:
    settings = Settings(
        database_url="postgresql://rota:s3cret@db/app?sslpassword=x&password=pw2",
        redis_url="rediss://default:hunter2@cache:6380/0",
    )
    for text in (repr(settings), str(settings)):
        assert "s3cret" not in text and "hunter2" not in text and "pw2" not in text
        assert "***" in text


def test_an_allow_list_of_queues(app: rota.App) -> None:
    limited = rota.App(Settings(queues="pdfs, mail"))
    limited.batch([limited.prepare("x.y", queue="mail", tenant="a")])
    with pytest.raises(ValidationError, match="ROTA_QUEUES"):
        limited.batch([limited.prepare("x.y", queue="other", tenant="a")])
    with pytest.raises(ValidationError, match="ROTA_QUEUES"):
        limited.task(queue="other")(noop)
    with pytest.raises(ValueError):
        Settings(queues="Bad Name")


@given(
    st.lists(
        st.one_of(
            st.integers(min_value=-(10**6), max_value=10**6),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.integers(min_value=2**64 - 3, max_value=2**64 + 3),  # the edges
            st.integers(min_value=-(2**63) - 3, max_value=-(2**63) + 3),
            st.integers(min_value=10**18 - 3, max_value=10**20 + 3),  # 19-21 digits
            st.from_regex(r"[0-9 ]{0,40}", fullmatch=True),
        ),
        max_size=30,
    )
)
def test_integers_are_refused_exactly_when_one_is_past_64_bits(args: list[Any]) -> None:
    # The filters that spare most payloads the slow parse (few digits, no 19
    # in a row) never let an integer past 64 bits through, and strings of
    # digits never count.
    low, high = rules.INT_RANGE
    text = json.dumps({"args": args, "kwargs": {}})
    if any(type(a) is int and not low <= a <= high for a in args):
        with pytest.raises(ValidationError, match="64 bits"):
            rules.check_json_integers(text)
    else:
        rules.check_json_integers(text)


@pytest.mark.parametrize("bad", [10, -1])
def test_a_priority_out_of_range_says_the_range(app: rota.App, bad: int) -> None:
    with pytest.raises(ValidationError, match=r"priority must be an integer in \[0, 9\], got"):
        _enqueue_batch(app, priority=bad)


def test_priority_defaults_to_the_tasks_own_and_a_call_may_change_it(app: rota.App) -> None:
    assert _enqueue_batch(app).priorities == [0]
    assert _enqueue_batch(app, priority=9).priorities == [9]

    @app.task(priority=5)
    def urgent() -> None: ...

    calls = [urgent.using(tenant="a").prepare(), urgent.using(tenant="a", priority=0).prepare()]
    calls.append(app.prepare("elsewhere.task", queue="q", tenant="a", priority=2))
    assert app.batch(calls).priorities == [5, 0, 2]


def test_an_imported_row_may_carry_a_priority() -> None:
    from rota.loader.importer import validate_row

    defaults = {"queue": "q", "allowed_queues": None, "max_attempts": 3, "max_payload_bytes": 1024}
    row = {"name": "x.y", "tenant": "t"}
    assert validate_row(row, defaults).priority == 0
    assert validate_row({**row, "priority": 7}, defaults).priority == 7
    assert validate_row({**row, "priority": "3"}, defaults).priority == 3  # CSV: text
    for bad in (10, -1, "10", 2.5):
        with pytest.raises(ValidationError, match="priority"):
            validate_row({**row, "priority": bad}, defaults)
