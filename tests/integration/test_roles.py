"""Least privilege: each component's role can do its job and is refused the rest.

Roles are cluster-wide, so this module runs its own PostgreSQL server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import App, Settings, core
from rota.consumer import Maintenance
from rota.core import db
from rota.core.migrate import Migrated, migrate
from rota.loader import Loader
from rota_tools.devservers import Server, local_postgres
from tests.helpers import envelopes

Conn = psycopg.Connection[Any]
COMPONENTS = ("producer", "loader", "worker", "admin")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Server]:
    with local_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def urls(cluster: Server) -> dict[str, str]:
    """Migrated with --roles; a login user per component, member of its role."""
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE app")
    base = cluster.url.rsplit("/", 1)[0].replace("rota@", "{user}@") + "/app"
    with psycopg.connect(base.format(user="rota"), autocommit=True) as conn:
        assert migrate(conn, roles=True).versions
        for component in COMPONENTS:
            conn.execute(f"CREATE ROLE app_{component} LOGIN IN ROLE rota_{component}")
        conn.execute("CREATE ROLE app_migrator LOGIN IN ROLE rota_owner")
    urls = {c: base.format(user=f"app_{c}") for c in (*COMPONENTS, "migrator")}
    return {**urls, "rota": base.format(user="rota")}


def tick_task(tick: str) -> None: ...


def _refused(conn: Conn, statement: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


@pytest.fixture
def owner(urls: dict[str, str]) -> Iterator[Conn]:
    with psycopg.connect(urls["rota"], autocommit=True) as conn:
        conn.execute("TRUNCATE rota.tasks, rota.ready, rota.running, rota.scheduled, rota.finished")
        yield conn


def test_everything_belongs_to_rota_owner_and_nothing_to_public(owner: Conn) -> None:
    owners = owner.execute(
        "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class "
        "WHERE relnamespace = 'rota'::regnamespace "
        "UNION SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc "
        "WHERE pronamespace = 'rota'::regnamespace"
    ).fetchall()
    assert owners == [("rota_owner",)]
    public = owner.execute(
        "SELECT p.oid::regprocedure FROM pg_proc p "
        "WHERE p.pronamespace = 'rota'::regnamespace "
        "AND has_function_privilege('public', p.oid, 'EXECUTE')"
    ).fetchall()
    assert public == []
    definers = owner.execute(
        "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = 'rota'::regnamespace "
        "AND prosecdef"
    ).fetchall()
    assert {
        "promote_due",
        "worker_claim",
        "worker_complete",
        "worker_complete_claim",
        "name_ids",
    } <= {n for n, _ in definers}
    assert all("search_path=pg_catalog, pg_temp" in config for _, config in definers)


def test_the_producer_enqueues_and_may_do_nothing_else(urls: dict[str, str], owner: Conn) -> None:
    db.transact(owner, core.configure_tenant("alice", capacity=1000))
    settings = Settings(database_url=urls["producer"], redis_url="redis://127.0.0.1:1/0")
    app = App(settings)
    try:
        # Redis unreachable: the fallback loads straight into PostgreSQL.
        task_id = app.enqueue("x.y", queue="q", tenant="alice", countdown=60)
        assert app.enqueue("x.y", queue="q", tenant="bob") != task_id
    finally:
        app.close()
    assert owner.execute("SELECT count(*) FROM rota.tasks").fetchone() == (2,)
    with db.connect(urls["producer"]) as conn:
        assert db.run(conn, core.tenant_backlogs())["alice"][0] == 1000
        _refused(conn, "SELECT payload FROM rota.tasks")
        _refused(conn, "DELETE FROM rota.tasks")
        _refused(conn, "UPDATE rota.tenants SET weight = 2")
        _refused(conn, "DELETE FROM rota.ready")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.run(conn, core.claim(["q"], 10, "w"))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.run(conn, core.configure_tenant("alice", weight=5))


def test_the_worker_claims_reports_and_maintains_through_functions_only(
    urls: dict[str, str], owner: Conn
) -> None:
    db.transact(owner, core.load(envelopes("alice", 3, backoff_base=0.001)))
    db.transact(owner, core.configure_tenant("alice", concurrency_limit=2))
    w1 = core.WorkerKey.new("w1")
    with db.connect(urls["worker"]) as conn:
        db.run(conn, core.register_worker(w1, "host", 1, ["default"], 4, 0.5))
        assert db.run(conn, core.worker_heartbeat(w1))
        tasks = db.run(conn, core.claim(["default"], 10, w1))
        assert len(tasks) == 2  # the limit holds for this role too
        assert db.run(conn, core.extend_leases([t.token for t in tasks], 60, w1)) == {
            t.id for t in tasks
        }
        assert db.run(conn, core.complete([tasks[0].token], w1)) == {tasks[0].id}
        db.run(conn, core.fail([core.Failure(tasks[1].id, tasks[1].attempt, "boom")], w1))
        settings = Settings(database_url=urls["worker"])
        cron = App(settings)
        cron.periodic("* * * * *")(tick_task)
        maintenance = Maintenance(settings, cron)
        assert maintenance.fire_cron(conn) >= 1  # cron ticks load as the worker's role
        deadline = time.monotonic() + 10
        while maintenance.tick(conn).promoted == 0:  # the retry falls due in a millisecond
            assert time.monotonic() < deadline
        assert db.run(conn, core.worker_claims(w1)) == []
        db.run(conn, core.stop_worker(w1))
        for statement in (
            "UPDATE rota.tasks SET attempts = 0",
            "DELETE FROM rota.ready",
            "UPDATE rota.tenants SET running = 0",
            "DELETE FROM rota.running",
            "SELECT payload FROM rota.tasks",
            "SELECT * FROM rota.running",
            "SELECT secret_hash FROM rota.workers",
            "UPDATE rota.workers SET stopped_at = NULL",
        ):
            _refused(conn, statement)
        for call in (
            core.configure_tenant("alice", weight=5),
            core.claim(["default"], 1, "w1"),  # as a worker, without its key
            core.complete([tasks[0].token]),
            core.worker_heartbeat("w1"),
            core.requeue_lost([tasks[0].id], "gone"),
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.run(conn, call)


def _serving(owner: Conn, urls: dict[str, str], tenant: str) -> bool:
    """Whether a task of `tenant` loaded now is claimed by an honest worker."""
    db.transact(owner, core.load(envelopes(tenant, 1)))
    honest = core.WorkerKey.new(f"honest-{time.monotonic_ns()}")
    with db.connect(urls["worker"]) as conn:
        db.run(conn, core.register_worker(honest, "host", 2, ["default"], 4, 5.0))
        claimed = db.run(conn, core.claim(["default"], 100, honest))
        db.run(conn, core.complete([t.token for t in claimed], honest))
    return tenant in {t.tenant for t in claimed}


def test_a_stolen_producer_or_loader_credential_cannot_stop_the_queue(
    urls: dict[str, str], owner: Conn
) -> None:
    db.transact(owner, core.load(envelopes("alice", 2)))
    (old,) = owner.execute("SELECT id FROM rota.tasks LIMIT 1").fetchone()  # type: ignore[misc]
    for role in ("producer", "loader"):
        with db.connect(urls[role]) as conn:
            # A duplicate place in line (every claim that met it would roll
            # back), a place or a tag of the caller's choosing: refused.
            for statement in (
                "INSERT INTO rota.ready SELECT * FROM rota.ready",
                "INSERT INTO rota.ready (queue_id, vtime, tenant_id, seq, task_id)"
                " VALUES (1, -1e300, 1, 1, gen_random_uuid())",
                "UPDATE rota.tenant_queues SET finish_tag = 1e300",
                "INSERT INTO rota.tenant_queues VALUES (1, 1, 1e300)",
                "INSERT INTO rota.scheduled VALUES (now(), gen_random_uuid())",
                "SELECT rota.advance_tags(ARRAY[1], ARRAY[1], ARRAY[-1e300], ARRAY[1])",
                "SELECT rota.enter_line(ARRAY[gen_random_uuid()], ARRAY[1::bigint], ARRAY[1],"
                " ARRAY[1], ARRAY[1::float8], ARRAY[0::int2])",
            ):
                _refused(conn, statement)
            # A task goes in line once, by the insert's trigger: what older
            # loaders call after their COPY (rota.enter_line_of) adds nothing.
            conn.execute("SELECT rota.enter_line_of(ARRAY[%s]::uuid[])", [old])
            (fresh,) = envelopes(f"{role}-twice", 1)
            with conn.transaction():
                db.run(conn, core.load([fresh]))
                for _ in range(2):
                    conn.execute("SELECT rota.enter_line_of(ARRAY[%s]::uuid[])", [fresh.id])
            places = owner.execute(
                "SELECT count(*) FROM rota.ready WHERE task_id = %s", [fresh.id]
            ).fetchone()
            assert places == (1,)
            # A row inserted as if tried before, or dead: stored, never
            # put in line (only a first attempt, pending or scheduled, is).
            for status, attempts in (("pending", 3), ("dead", 0)):
                forged = uuid.uuid4()
                conn.execute(
                    "INSERT INTO rota.tasks (id, seq, queue_id, tenant_id, name, payload, status,"
                    " attempts)"
                    " SELECT %s, nextval('rota.task_seq'), q, t, 'noop', '{}', %s, %s"
                    " FROM rota.name_ids(ARRAY['default'], ARRAY['mallory']) n,"
                    " unnest(n.queue_ids, n.tenant_ids) AS x(q, t)",
                    [forged, status, attempts],
                )
                conn.commit()
                assert owner.execute(
                    "SELECT count(*) FROM rota.ready WHERE task_id = %s", [forged]
                ).fetchone() == (0,)
    assert owner.execute("SELECT count(*) FROM rota.ready").fetchone() == (4,)  # 2 + 1 each
    assert _serving(owner, urls, "bob")  # the queue still serves every tenant


def test_a_worker_credential_touches_only_its_own_worker_s_tasks(
    urls: dict[str, str], owner: Conn
) -> None:
    db.transact(owner, core.load(envelopes("carol", 3)))
    victim, thief = core.WorkerKey.new("victim"), core.WorkerKey.new("thief")
    with db.connect(urls["worker"]) as conn:
        for key in (victim, thief):
            db.run(conn, core.register_worker(key, "host", 3, ["default"], 4, 30.0))
        # Registered again (a reply lost with the server): the same row; with
        # another secret, nothing is taken over (the forged calls below fail).
        db.run(conn, core.register_worker(victim, "host", 3, ["default"], 4, 30.0))
        forged = core.WorkerKey("victim", b"guessed")
        db.run(conn, core.register_worker(forged, "elsewhere", 9, ["default"], 4, 30.0))
        held = db.run(conn, core.claim(["default"], 3, victim))
        tokens = [t.token for t in held]
        # The thief's key completes, fails, hands back or extends none of them.
        assert db.run(conn, core.complete(tokens, thief)) == set()
        assert db.run(conn, core.complete_and_claim(tokens, ["default"], 3, thief)) == (0, [])
        assert db.run(conn, core.fail([core.Failure(*tokens[0], "x")], thief)) == []
        assert db.run(conn, core.release(tokens, thief)) == set()
        assert db.run(conn, core.extend_leases(tokens, 60, thief)) == set()
        assert db.run(conn, core.worker_claims(thief)) == []
        # Nor can it act as the victim without the victim's secret.
        for call in (
            core.complete(tokens, forged),
            core.complete_and_claim(tokens, ["default"], 1, forged),
            core.claim(["default"], 1, forged),
            core.stop_worker(forged),
            core.worker_heartbeat(forged),
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.run(conn, call)
        # A live worker is not declared dead, whoever asks.
        assert db.transact(conn, core.reap_workers(["victim"])) == set()
        # History younger than rota.limits stays, whatever interval is asked.
        db.run(conn, core.fail([core.Failure(*tokens[1], "x", final=True)], victim))
        assert db.run(conn, core.complete_and_claim([tokens[0]], ["default"], 1, victim)) == (1, [])
        assert db.run(conn, core.prune_finished(0)) == 0
        assert db.run(conn, core.prune_dead(0)) == 0
        db.run(conn, core.stop_worker(thief))
        assert db.run(conn, core.prune_workers(0)) == 0  # stopped a moment ago: kept
        assert db.run(conn, core.worker_claims(victim)) == [tokens[2]]  # still its own
    # An admin may prune as it is told.
    assert db.run(owner, core.prune_finished(0)) == 1
    assert _serving(owner, urls, "bob")


def test_the_loader_loads_the_buffer_and_may_do_nothing_else(
    urls: dict[str, str], owner: Conn, redis_url: str
) -> None:
    app = App(Settings(database_url=urls["rota"], redis_url=redis_url))
    try:
        app.enqueue_many([app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(50)])
    finally:
        app.close()
    loader = Loader(Settings(database_url=urls["loader"], redis_url=redis_url))
    try:
        summary = loader.drain()
    finally:
        loader.close()
    assert summary.drained and summary.loaded == 50 and not summary.errors
    with db.connect(urls["loader"]) as conn:
        _refused(conn, "DELETE FROM rota.tasks")
        _refused(conn, "UPDATE rota.tasks SET attempts = 0")
        _refused(conn, "SELECT payload FROM rota.tasks")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.run(conn, core.claim(["q"], 10, "w"))


def test_the_admin_configures_tenants(urls: dict[str, str], owner: Conn) -> None:
    with db.connect(urls["admin"]) as conn:
        db.transact(conn, core.configure_tenant("carol", weight=3))
        assert db.run(conn, core.queue_counts()) is not None
        assert db.run(conn, core.prune_finished(3600)) == 0


def test_migrations_run_as_the_owner_role(urls: dict[str, str]) -> None:
    with psycopg.connect(urls["migrator"], autocommit=True) as conn:
        assert migrate(conn) == Migrated()  # up to date: nothing to apply as rota_owner


def test_a_changed_function_file_is_applied_as_the_owner_keeping_grants(
    urls: dict[str, str],
) -> None:
    claim = "rota.claim(text[], integer, text, double precision)"
    with psycopg.connect(urls["migrator"], autocommit=True) as conn:
        conn.execute(
            "UPDATE rota.repeatables SET checksum = 'older' WHERE name = 'functions/claim.sql'"
        )
        assert migrate(conn) == Migrated(functions=["functions/claim.sql"])
        row = conn.execute(
            "SELECT pg_get_userbyid(proowner), prosecdef, proconfig,"
            " has_function_privilege('rota_admin', oid, 'EXECUTE'),"
            " has_function_privilege('public', oid, 'EXECUTE')"
            " FROM pg_proc WHERE oid = %s::regprocedure",
            [claim],
        ).fetchone()
    settings = ["enable_seqscan=off", "search_path=pg_catalog, pg_temp"]
    assert row == ("rota_owner", True, settings, True, False)


def test_print_roles_is_the_same_script() -> None:
    from rota.core.migrate import roles_script

    script = roles_script()
    assert "CREATE ROLE" in script and "GRANT EXECUTE" in script and "OWNER TO rota_owner" in script


def test_the_audit_log_is_append_only_for_admins(urls: dict[str, str]) -> None:
    with db.connect(urls["admin"]) as conn:
        db.run(conn, core.record("console:ops", "pause", "queue q", 0, {}))
        for statement in (
            "UPDATE rota.audit SET actor = 'nobody'",
            "DELETE FROM rota.audit",
            "TRUNCATE rota.audit",
        ):
            _refused(conn, statement)
        assert conn.execute("SELECT count(*) FROM rota.audit").fetchone()[0] >= 1  # type: ignore[index]
