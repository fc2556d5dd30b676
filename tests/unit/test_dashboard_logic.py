"""The operations' pure logic: why a task waits, in words; who may act in
the console; bounded metric labels; JSON logs; the CLI's tables."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.requests import Request

from rota.cli.output import table
from rota.core.stored import StoredTask
from rota.dashboard.auth import (
    COOKIE,
    LOOPBACK,
    SCOPES,
    Guard,
    Principal,
    read_tokens,
    token_hash,
)
from rota.errors import ValidationError
from rota.model.jsondata import plain
from rota.readmodel.metrics import OTHER, TenantLabels
from rota.readmodel.story import InBuffer, RunWords, ran_for, run_words, why, why_in_buffer
from rota.runtime.logs import JsonFormatter

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def stored(**fields: Any) -> StoredTask:
    base: dict[str, Any] = dict(
        id=uuid.uuid4(),
        queue="pdfs",
        tenant="acme",
        name="app.parse",
        payload="{}",
        status="pending",
        attempts=0,
        max_attempts=3,
        cost=1.0,
        eta=None,
        enqueued_at=NOW - timedelta(minutes=1),
        loaded_at=None,
        finished_at=None,
        last_error=None,
        traceback=None,
        cancel_requested=False,
        worker=None,
        attempt=None,
        claimed_at=None,
        lease_expires_at=None,
        run_at=None,
        queue_workers=2,
        ahead=7,
    )
    return StoredTask(**{**base, **fields})


def test_why_a_ready_task_waits() -> None:
    assert why(stored(), NOW) == (
        "ready: in line, with 7 claimable tasks ahead of it in queue pdfs (fair order); "
        "2 live worker(s) claim this queue"
    )
    held = why(stored(concurrency_limit=5, tenant_running=5, queue_workers=0), NOW)
    assert "tenant acme is at its concurrency limit: 5 claimed of 5 (running or prefetched)" in held
    assert "no live worker claims queue pdfs" in held
    rate = why(stored(rate_limit=2.0, tokens=0.5), NOW)
    assert "out of rate tokens (2/s): the next comes in 0.2 s" in rate
    deep = why(stored(ahead=643_211, ahead_estimated=True), NOW)
    assert deep.startswith(
        "ready: in line, with about 640,000 claimable tasks ahead of it "
        "(over 10,000 counted; the rest estimated from a sample) in queue pdfs"
    )
    paused = why(stored(queue_paused=True, tenant_paused=True), NOW)
    assert "its queue pdfs is paused" in paused and "its tenant acme is paused" in paused


def test_why_other_states() -> None:
    soon = stored(status="scheduled", run_at=NOW + timedelta(seconds=30), eta=NOW)
    assert why(soon, NOW) == "scheduled: waits for its ETA; it is due in 30.0 s"
    retry = stored(
        status="scheduled",
        attempts=1,
        last_error="KeyError: 'x'",
        run_at=NOW + timedelta(minutes=5),
    )
    assert why(retry, NOW) == (
        "scheduled: waits for its retry backoff after attempt 1 of 3 failed (KeyError: 'x'); "
        "it is due in 5.0 min"
    )
    running = stored(
        worker="w1",
        attempt=2,
        claimed_at=NOW - timedelta(seconds=3),
        started_at=NOW - timedelta(seconds=2),
        lease_expires_at=NOW + timedelta(seconds=57),
        claim_running=True,
    )
    assert why(running, NOW).startswith(
        "running on worker w1 since 2026-11-24T11:59:58.000+00:00 (2.0 s) (attempt 2 of 3)"
    )
    untold = dataclasses.replace(running, started_at=None)
    assert why(untold, NOW).startswith(
        "running on worker w1 since about 2026-11-24T11:59:57.000+00:00, its claim (3.0 s; "
    )
    prefetched = dataclasses.replace(running, started_at=None, claim_running=False)
    assert why(prefetched, NOW).startswith(
        "claimed by worker w1, waiting for a free slot (prefetched) for 3.0 s (attempt 2 of 3)"
    )
    assert run_words(prefetched, NOW) == RunWords(
        "2026-11-24T11:59:57.000+00:00", "not started (prefetched)", "-"
    )
    dead = stored(status="dead", attempts=3, last_error="ValueError: no")
    assert why(dead, NOW) == "dead after attempt 3 of 3: ValueError: no"


def test_a_succeeded_tasks_run_in_words() -> None:
    claimed = NOW - timedelta(seconds=1)
    done = stored(
        status="succeeded",
        attempts=1,
        finished_at=NOW,
        claimed_at=claimed,
        started_at=claimed + timedelta(milliseconds=300),
        ran_seconds=0.0502,
    )
    assert why(done, NOW) == (
        "succeeded 0.0 s ago after 1 attempt(s); claimed at 2026-11-24T11:59:59.000+00:00, "
        "started at 2026-11-24T11:59:59.300+00:00, ran 0.05 s"
    )
    # Recorded before runs' starts were kept: its start is its claim's time.
    old = dataclasses.replace(done, claimed_at=None, started_at=claimed, ran_seconds=None)
    assert run_words(old, NOW) == RunWords(
        "2026-11-24T11:59:59.000+00:00",
        "not recorded (claimed at 2026-11-24T11:59:59.000+00:00)",
        "not recorded",
    )
    # Completed by a worker that does not measure its runs.
    untold = dataclasses.replace(done, started_at=claimed, ran_seconds=None)
    assert run_words(untold, NOW) == old_words(claimed)
    assert [ran_for(s) for s in (0.05, 0.0123, 0.5, 3.25, 150)] == [
        "0.05 s",
        "0.012 s",
        "0.5 s",
        "3.2 s",
        "2.5 min",
    ]


def old_words(claimed: datetime) -> RunWords:
    at = claimed.isoformat(timespec="milliseconds")
    return RunWords(at, f"not recorded (claimed at {at})", "not recorded")


def test_why_in_the_buffer() -> None:
    place = InBuffer("rota:buffer:{1}", "1-0", 12, 3.5, 0)
    assert why_in_buffer(place) == (
        "still in the Redis buffer (rota:buffer:{1}), not yet loaded into PostgreSQL: "
        "12 entries ahead of it in its shard (up to 3,072 tasks: an entry holds up to 256); "
        "the shard's oldest entry is 3.5 s old; no estimate of when it starts until it is "
        "loaded and has a place in line"
    )
    stuck = why_in_buffer(InBuffer("s", "1-0", 0, 600, 0))
    assert "10.0 min old (is a loader running?); no estimate" in stuck
    assert "read it 2 time(s)" in why_in_buffer(InBuffer("s", "1-0", 0, 1, 2))


def request(headers: dict[str, str] | None = None, cookie: str | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookie is not None:
        raw.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": raw,
        "scheme": "http",
        "server": ("127.0.0.1", 8377),
        "query_string": b"",
    }
    return Request(scope)


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


WALL, OPS = "wall-screen-token-0123", "operator-token-0123456"


def _guard(clock: Clock) -> Guard:
    return Guard(
        {
            token_hash(WALL): Principal("wall", frozenset({"read", "metrics"})),
            token_hash(OPS): Principal("ops", frozenset(SCOPES)),
        },
        session_seconds=3600,
        clock=clock,
    )


def test_without_tokens_the_console_reads_but_never_acts() -> None:
    open_console = Guard({}, 3600)
    assert open_console.who(request()) == LOOPBACK
    assert open_console.check(request(), "read") is None
    assert "ROTA_DASHBOARD_TOKEN" in (open_console.check(request(), "act") or "")
    assert open_console.check(request(), "enqueue") is not None


def test_each_token_may_do_its_scopes_only() -> None:
    guard = _guard(Clock())
    assert guard.who(request()) is None
    wall = request({"Authorization": f"Bearer {WALL}"})
    assert guard.who(wall) == Principal("wall", frozenset({"read", "metrics"}))
    assert guard.check(wall, "read") is None and guard.check(wall, "metrics") is None
    assert guard.check(wall, "act") == "the token 'wall' may not act"
    assert guard.check(wall, "enqueue") == "the token 'wall' may not enqueue"
    ops_ = request({"Authorization": f"bearer {OPS}"})
    assert guard.check(ops_, "act") is None and guard.check(ops_, "enqueue") is None
    for bad in ("Bearer wrong", "Bearer ", "Basic x", "Bearer t\u00f6ken", "Bearer " + "x" * 5000):
        assert guard.who(request({"Authorization": bad})) is None


def test_sessions_expire_and_posts_need_their_csrf_and_own_origin() -> None:
    clock = Clock()
    guard = _guard(clock)
    found = guard.login(OPS, "10.0.0.1")
    assert isinstance(found, Principal) and found.name == "ops"
    session = guard.session_value(found)
    assert OPS not in session  # the cookie is not the token
    assert guard.who(request(cookie=session)) == found
    assert guard.check(request(cookie=session), "act") == "a missing or wrong CSRF token"
    csrf = guard.csrf_value(request(cookie=session))
    assert guard.check(request(cookie=session), "act", csrf) is None
    evil = request({"Origin": "http://evil.example"}, cookie=session)
    assert guard.check(evil, "act", csrf) == "a request from another site"
    own = request({"Origin": "http://127.0.0.1:8377"}, cookie=session)
    assert guard.check(own, "act", csrf) is None
    assert guard.check(request(), "act", csrf) == "log in first"
    assert (
        guard.check(request(cookie=session), "act", "t\u00f6ken") == "a missing or wrong CSRF token"
    )
    for forged in (
        "ops:9999999999:00",
        "wall" + session[3:],
        "ops:x:y",
        "\u00e9:1:2",
        "a:1:\u00e9",
        "",
    ):
        assert guard.who(request(cookie=forged)) is None
    clock.now += 3601
    assert guard.who(request(cookie=session)) is None  # expired


def test_logins_are_throttled_per_address() -> None:
    clock = Clock()
    guard = _guard(clock)
    for _ in range(5):
        assert guard.login("wrong", "10.0.0.1") == "wrong token"
    assert "too many" in str(guard.login(OPS, "10.0.0.1"))  # even the right token waits
    assert isinstance(guard.login(OPS, "10.0.0.2"), Principal)  # another address does not
    clock.now += 61
    assert isinstance(guard.login(OPS, "10.0.0.1"), Principal)


def test_the_tokens_file(tmp_path: Any) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# name scopes sha256\nwall read,metrics {token_hash(WALL)}\n\n")
    assert read_tokens(path) == {
        token_hash(WALL): Principal("wall", frozenset({"read", "metrics"}))
    }
    for bad, reason in (
        ("wall read", "expected `NAME SCOPES SHA256`"),
        (f"wall root {token_hash(WALL)}", "scopes must be some of"),
        (f"a read {token_hash(WALL)}\na read {token_hash(OPS)}", "used twice"),
        ("a read " + "z" * 64, "not hexadecimal"),
    ):
        path.write_text(bad)
        with pytest.raises(ValidationError, match=reason):
            read_tokens(path)


def test_metric_labels_stay_bounded() -> None:
    label = TenantLabels(limit=2)
    assert [label(t) for t in ["a", "b", "c", "a", "d"]] == ["a", "b", OTHER, "a", OTHER]


def test_json_logs_hide_passwords() -> None:
    record = logging.LogRecord(
        "rota.x", logging.WARNING, __file__, 1, "cannot reach postgresql://u:pw@host/db", None, None
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "warning" and entry["logger"] == "rota.x"
    assert "pw" not in entry["message"] and "u:***@host" in entry["message"]


def test_plain_and_tables() -> None:
    task_id = uuid.uuid4()
    assert plain({"id": task_id, "at": NOW, "rows": (1, 2)}) == {
        "id": str(task_id),
        "at": NOW.isoformat(),
        "rows": [1, 2],
    }
    assert table(["a", "bb"], [(1, None), (1234, 2.5)]).splitlines() == [
        "a      bb",
        "1      -",
        "1,234  2.5",
    ]
    assert table(["a"], []) == "a\n(none)"


def test_patching_a_tenant_is_checked_before_anything_runs() -> None:
    from rota import core
    from rota.errors import ValidationError

    with pytest.raises(ValidationError, match="unknown tenant settings"):
        core.patch_tenant("gold", {"speed": 3}, "me")
    with pytest.raises(ValidationError, match="weight cannot be cleared"):
        core.patch_tenant("gold", {"weight": None}, "me")
    with pytest.raises(ValidationError):
        core.patch_tenant("gold", {"rate_limit": 0}, "me")
