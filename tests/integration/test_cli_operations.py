"""The operators' commands through real processes: text for people, --json
for scripts, and what each does to the queue."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from rota import App, Settings, core
from rota.core import db
from tests.helpers import claim, envelopes, load
from tests.integration.test_cli_errors import rota

Conn = psycopg.Connection[Any]


def env_of(settings: Settings) -> dict[str, str]:
    return {"ROTA_DATABASE_URL": settings.database_url, "ROTA_REDIS_URL": settings.redis_url}


def run_json(settings: Settings, *args: str) -> Any:
    done = rota(*args, "--json", **env_of(settings))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_task_show_cancel_and_retry(settings: Settings, conn: Conn) -> None:
    load(conn, envelopes("alice", 1) + envelopes("bob", 1, max_attempts=1))
    ids = {t.tenant: t.id for t in claim(conn, 10)}
    db.transact(conn, core.fail([core.Failure(ids["bob"], 1, "KeyError: 'x'", traceback="Tb!")]))
    db.transact(conn, core.release([(ids["alice"], 1)]))

    shown = rota("task", "show", str(ids["bob"]), **env_of(settings))
    assert shown.returncode == 0
    assert "dead after attempt 1 of 1: KeyError: 'x'" in shown.stdout and "Tb!" in shown.stdout
    story = run_json(settings, "task", "show", str(ids["alice"]))
    assert story["where"] == "ready" and story["task"]["ahead"] == 0

    assert run_json(settings, "task", "cancel", str(ids["alice"])) == {
        str(ids["alice"]): "cancelled"
    }
    retried = rota("task", "retry", str(ids["bob"]), str(ids["alice"]), **env_of(settings))
    assert retried.returncode == 0 and "retried" in retried.stdout
    assert db.run(conn, core.task_states([ids["bob"]]))[ids["bob"]].status == "scheduled"

    missing = rota("task", "show", "00000000-0000-7000-8000-000000000000", **env_of(settings))
    assert missing.returncode == 1 and "no task with this id" in missing.stdout
    bad = rota("task", "cancel", "not-an-id", **env_of(settings))
    assert bad.returncode == 2 and bad.stderr.startswith("rota: 'not-an-id' is not a task id")
    actors = {row[0] for row in conn.execute("SELECT actor FROM rota.audit")}
    assert len(actors) == 1 and actors.pop().startswith("cli:")


def test_tasks_and_dead_retry(settings: Settings, conn: Conn) -> None:
    load(conn, envelopes("alice", 3, queue="pdfs", max_attempts=1))
    for task in claim(conn, 10, queues=("pdfs",)):
        db.transact(conn, core.fail([core.Failure(task.id, 1, "boom", final=True)]))
    listed = run_json(settings, "tasks", "--state", "dead", "--tenant", "alice", "--limit", "2")
    assert len(listed) == 2 and {t["last_error"] for t in listed} == {"boom"}
    text = rota("tasks", "--state", "dead", **env_of(settings)).stdout
    assert "alice" in text and "boom" in text
    assert run_json(settings, "dead", "retry", "--queue", "pdfs", "--since", "1h") == {"retried": 3}


def test_tenants_change_only_what_is_given(settings: Settings, conn: Conn) -> None:
    run_json(settings, "tenant", "gold", "--weight", "2", "--concurrency-limit", "5")
    changed = run_json(settings, "tenant", "gold", "--weight", "3")
    assert changed["now"]["weight"] == 3.0 and changed["now"]["concurrency_limit"] == 5
    cleared = run_json(settings, "tenant", "gold", "--clear", "concurrency_limit")
    assert cleared["now"]["concurrency_limit"] is None and cleared["now"]["weight"] == 3.0
    load(conn, envelopes("gold", 2) + envelopes("lead", 1))
    db.run(conn, core.refresh_stats())
    listing = run_json(settings, "tenant", "list", "--sort", "name", "--ascending")
    assert [t["name"] for t in listing["rows"]] == ["gold", "lead"] and listing["total"] == 2
    shown = run_json(settings, "tenant", "show", "gold")
    assert shown["queues"][0]["waiting"] == 2
    assert run_json(settings, "tenant", "pause", "gold") == {"tenant": "gold", "paused": True}
    assert [t.tenant for t in claim(conn, 10)] == ["lead"]
    run_json(settings, "tenant", "resume", "gold")
    assert rota("tenant", "show", "nobody", **env_of(settings)).returncode == 1
    bad = rota("tenant", "gold", "--weight", "-1", **env_of(settings))
    assert bad.returncode == 2 and "weight" in bad.stderr


def test_a_tenant_named_like_an_action_is_changed_with_set(settings: Settings) -> None:
    named_list = run_json(settings, "tenant", "set", "list", "--weight", "4")
    assert named_list["tenant"] == "list" and named_list["now"]["weight"] == 4.0
    assert run_json(settings, "tenant", "show", "list")["weight"] == 4.0
    listing = run_json(settings, "tenant", "list")
    assert [t["name"] for t in listing["rows"]] == ["list"]
    ambiguous = rota("tenant", "list", "--weight", "2", **env_of(settings))
    assert ambiguous.returncode == 2 and "rota tenant set list" in ambiguous.stderr


def test_queues_prune_and_stats(app: App, settings: Settings, conn: Conn) -> None:
    load(conn, envelopes("alice", 2, queue="pdfs"))
    assert run_json(settings, "queue", "pause", "pdfs") == {"queue": "pdfs", "paused": True}
    assert claim(conn, 10, queues=("pdfs",)) == []
    run_json(settings, "queue", "resume", "pdfs")
    for task in claim(conn, 10, queues=("pdfs",)):
        db.transact(conn, core.complete([task.token]))
    conn.execute("UPDATE rota.finished SET finished_at = now() - interval '8 days'")
    assert run_json(settings, "prune", "--older-than", "7d") == {"finished": 2, "dead": 0}

    app.tasks["parse_pdf"].using(tenant="bob").enqueue("a.pdf")
    stats = run_json(settings, "stats")
    assert stats["unavailable"] == {}
    assert sum(shard["entries"] for shard in stats["buffer"].values()) == 1
    assert stats["dead_letters"] == 0 and [q["name"] for q in stats["queues"]] == ["pdfs"]
    text = rota("stats", **env_of(settings)).stdout
    assert "pdfs" in text and "dead letters: 0" in text
    prometheus = rota("stats", "--format", "prometheus", **env_of(settings)).stdout
    assert 'rota_buffer_entries{shard="rota:buffer:{' in prometheus

    # One server down: the rest is still printed, and said.
    redis_down = {**env_of(settings), "ROTA_REDIS_URL": "redis://127.0.0.1:1/0"}
    partial = rota("stats", **redis_down)
    assert partial.returncode == 0 and "redis unavailable" in partial.stdout
    assert "pdfs" in partial.stdout
    pg_down = {**env_of(settings), "ROTA_DATABASE_URL": "postgresql://127.0.0.1:1/x"}
    other = rota("stats", "--format", "json", **pg_down)
    assert other.returncode == 0 and "postgresql" in json.loads(other.stdout)["unavailable"]


def test_dead_letters_commands(app: App, settings: Settings, conn: Conn) -> None:
    from rota.loader import Loader

    app.tasks["parse_pdf"].using(tenant="alice").enqueue("a.pdf")
    loader = Loader(settings.model_copy(update={"queues": "mail"}))
    loader.drain()
    loader.close()
    listing = run_json(settings, "dead-letters", "list")
    assert listing["total"] == 1
    letter = listing["letters"][0]
    shown = run_json(settings, "dead-letters", "show", letter["id"])
    assert "ROTA_QUEUES" in shown["reason"]
    replayed = run_json(settings, "dead-letters", "replay", letter["id"])
    assert replayed["loaded"] == {letter["id"]: 1}
    assert len(claim(conn, 10, queues=("pdfs",))) == 1
    assert rota("dead-letters", "purge", **env_of(settings)).returncode == 2
    assert run_json(settings, "dead-letters", "purge", "--all") == {"purged": 0}
