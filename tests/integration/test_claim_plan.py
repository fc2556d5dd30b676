"""The claim stays an index scan, and its transaction stays on the lock fast path."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from rota import core
from rota.core import db
from rota.sql import query
from tests.helpers import envelopes, load

Conn = psycopg.Connection[Any]
PARAMS = {"queues": ["default"], "limit": 100, "worker": "w", "lease_seconds": 60.0}


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


def _backlog(conn: Conn, tenants: int = 50) -> None:
    load(conn, [e for t in range(tenants) for e in envelopes(f"t{t}", 20_000 // tenants)])
    conn.execute("ANALYZE rota.ready")
    conn.execute("ANALYZE rota.tasks")


# One tenant holding the whole backlog (the noisy neighbour) once made the
# planner expect no row to pass the blocked-tenants filter and sort a seq scan.
@pytest.mark.parametrize("tenants", [50, 1], ids=["many-tenants", "one-tenant"])
@pytest.mark.parametrize("limited", [False, True], ids=["no-limit", "a-limited-tenant"])
def test_the_claim_reads_ready_through_its_fair_order_index(
    conn: Conn, tenants: int, limited: bool
) -> None:
    _backlog(conn, tenants)
    if limited:
        db.transact(conn, core.configure_tenant("t0", concurrency_limit=1_000))
    plan = _claim_plan(conn)
    # Tenants' limits are read only while some tenant is limited (the probe decided).
    assert ("CTE limits" in json.dumps(plan)) == limited
    scans = [
        (n["Node Type"], n.get("Relation Name"), n.get("Index Name"))
        for n in _plan_nodes(plan)
        if "Relation Name" in n
    ]
    assert ("Index Scan", "ready", "ready_fair_order") in scans, scans
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in {"ready", "tasks"}], scans
    assert ("Index Scan", "tasks", "tasks_pkey") in scans, scans


@pytest.mark.parametrize("urgent", [0, 300], ids=["no-urgent-task", "urgent-tasks"])
def test_urgent_tasks_are_found_through_their_partial_index(conn: Conn, urgent: int) -> None:
    _backlog(conn)
    load(conn, [e for t in range(0, 50, 5) for e in envelopes(f"t{t}", urgent // 10, priority=5)])
    conn.execute("ANALYZE rota.ready")
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_analyze = on")
    plan = _claim_plan(conn)
    nodes = _plan_nodes(plan)
    scans = [
        (n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "ready"
    ]
    assert not [s for s in scans if s[0] == "Seq Scan"], scans
    assert ("Index Scan", "ready_fair_order") in scans, scans
    # Without an urgent task the plain claim runs (the function's probe
    # decided); with some, the claimed tenants' (50 in a claim of 100) are
    # looked for through the partial index.
    loops = sorted(n["Actual Loops"] for n in nodes if n.get("Index Name") == "ready_urgent")
    assert loops == ([] if not urgent else [50]), loops
    assert ("urgent" in json.dumps(plan)) == bool(urgent)


@pytest.mark.parametrize("waiting", [150, 20_000], ids=["small-table", "backlog"])
def test_the_claim_reads_each_claimed_task_by_one_probe_of_its_key(
    conn: Conn, waiting: int
) -> None:
    # Joined to the claimed rows, the tasks were read through `id = ANY(the
    # batch's ids)`: planned on a small table (a fleet keeping up), a nested
    # loop sorted the batch's ids again for every task, 2.3 ms a claim of 100.
    if waiting > 1_000:
        _backlog(conn)
    else:
        load(conn, envelopes("t", waiting))
        conn.execute("ANALYZE rota.tasks")
    reads = [
        (n["Node Type"], n.get("Index Name"), n.get("Index Cond"))
        for n in _plan_nodes(_claim_plan(conn))
        if n.get("Relation Name") == "tasks"
    ]
    assert reads == [("Index Scan", "tasks_pkey", "(id = a.task_id)")], reads


def _claim_plan(conn: Conn) -> dict[str, Any]:
    """The plan of the statement inside rota.claim, as workers run it (a
    generic plan), from auto_explain's report of nested statements."""
    with conn.transaction(force_rollback=True):
        return _nested_plan(
            conn,
            lambda: db.run(conn, core.claim(**PARAMS)),  # type: ignore[arg-type]
            lambda text: "SKIP LOCKED" in text and "rota.ready" in text,
        )


def _nested_plan(
    conn: Conn, run: Callable[[], object], matches: Callable[[str], bool]
) -> dict[str, Any]:
    """The plan, as run, of the first statement nested in `run`'s functions
    whose text `matches`, from auto_explain's report (generic plans, as
    workers run them)."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_level = notice",
        "auto_explain.log_format = json",
        "plan_cache_mode = force_generic_plan",
    ):
        conn.execute(f"SET {setting}")
    run()
    for notice in notices:
        report = json.loads(notice[notice.index("{") :])
        if matches(report["Query Text"]):
            plan: dict[str, Any] = report["Plan"]
            return plan
    raise AssertionError(f"no plan matched among {len(notices)} notices")


@pytest.mark.parametrize("tasks", [100, 3_000])
def test_completions_find_their_running_rows_by_a_hash_of_their_tokens(
    database_url: str, tasks: int
) -> None:
    # Planned on a near-empty running table, the join of tokens and running
    # rows was a nested loop comparing each row with every token: 2 ms for
    # 100 completions, quadratic for a mass requeue.
    with db.connect(database_url, synchronous_commit=False) as conn:  # as workers report
        load(conn, envelopes("t", tasks))
        conn.execute("ANALYZE rota.running")  # empty now: the estimate that misled
        got = db.run(conn, core.claim(["default"], tasks, "w"))
        with conn.transaction(force_rollback=True):
            plan = _nested_plan(
                conn,
                lambda: db.run(conn, core.complete(t.token for t in got)),
                lambda text: "DELETE FROM rota.running" in text,
            )
    # The delete of the running rows, in the completion's statement.
    (taken,) = [
        n
        for n in _plan_nodes(plan)
        if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "running"
    ]
    nodes = _plan_nodes(taken)
    joins = [n["Node Type"] for n in nodes if n["Node Type"] in {"Hash Join", "Nested Loop"}]
    assert joins and set(joins) == {"Hash Join"}, joins
    running = [n for n in nodes if n.get("Index Name") == "running_pkey"]
    assert running, [n["Node Type"] for n in nodes]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes


def test_a_failure_report_joins_its_tasks_rows_without_a_nested_loop(database_url: str) -> None:
    # Planned on small tables, a failure report's join of its tasks' rows
    # (`t.id = ANY(the batch's ids)`) was a nested loop whose index scan sorted
    # the batch's ids again for every row: 5 s for 3,000 failures.
    tasks = 1_000
    with db.connect(database_url, synchronous_commit=False) as conn:  # as workers report
        load(conn, envelopes("t", tasks))
        conn.execute("ANALYZE rota.tasks")
        conn.execute("ANALYZE rota.running")
        got = db.run(conn, core.claim(["default"], tasks, "w"))
        failures = [core.work.Failure(t.id, t.attempt, "boom") for t in got]
        with conn.transaction(force_rollback=True):
            plan = _nested_plan(
                conn,
                lambda: db.run(conn, core.fail(failures)),
                lambda text: "UPDATE rota.tasks t" in text,
            )
    nodes = [n["Node Type"] for n in _plan_nodes(plan)]
    assert "Hash Join" in nodes and "Nested Loop" not in nodes, nodes


def test_a_claim_transaction_locks_few_relations_all_on_the_fast_path(conn: Conn) -> None:
    _backlog(conn)
    db.transact(conn, core.configure_tenant("t1", concurrency_limit=5))
    with conn.transaction():
        got = db.run(conn, core.claim(["default"], 100, "w"))
        assert len(got) == 100
        locks = conn.execute(
            "SELECT c.relname, l.mode, l.fastpath FROM pg_locks l "
            "JOIN pg_class c ON c.oid = l.relation "
            "WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' "
            "AND c.relnamespace = 'rota'::regnamespace"
        ).fetchall()
    relations = {name for name, _, _ in locks}
    assert {"ready", "ready_fair_order", "tasks", "running", "tenants"} <= relations
    assert len(relations) < 16, " ".join(sorted(relations))
    assert all(fastpath for _, _, fastpath in locks), locks


def test_vacuum_never_truncates_the_queue_tables(conn: Conn) -> None:
    """Truncation would take an ACCESS EXCLUSIVE lock, stalling loads and
    claims and pushing them off the lock fast path (migrations 0010, 0031):
    emptied queue tables keep their pages."""
    load(conn, envelopes("t", 3_000))
    got = db.run(conn, core.claim(["default"], 3_000, "w"))
    db.run(conn, core.complete(t.token for t in got))

    def sizes() -> dict[str, int]:
        return {
            table: conn.execute("SELECT pg_relation_size(%s::regclass)", [table]).fetchone()[0]
            for table in ("rota.tasks", "rota.ready", "rota.running")
        }

    emptied = sizes()
    assert all(emptied.values()), emptied  # pages a truncation could take
    conn.execute("VACUUM rota.tasks, rota.ready, rota.running")
    assert sizes() == emptied
    # The check can fail: a table left to the default loses its empty pages.
    conn.execute("ALTER TABLE rota.running RESET (vacuum_truncate)")
    conn.execute("VACUUM rota.running")
    assert sizes()["rota.running"] == 0


def _flush_counts(conn: Conn) -> None:
    """pg_stat_xact_* also shows what earlier transactions did until the
    backend flushes its counts (at most once a second): flush them now."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def _read_in_transaction(conn: Conn, tables: list[str]) -> dict[str, tuple[int, int]]:
    """Per rota table: sequential scans, and rows fetched through an index, so
    far in the open transaction."""
    rows = conn.execute(
        "SELECT relname, seq_scan, coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'rota' AND relname = ANY(%s)",
        [tables],
    )
    return {name: (seq_scan, fetched) for name, seq_scan, fetched in rows}


def test_loading_looks_names_and_tags_up_by_index_even_when_planned_on_empty_tables(
    database_url: str,
) -> None:
    # PL/pgSQL keeps its plans for the session: planned while the tables looked
    # empty, the loader's lookups once scanned the whole table per tenant, and
    # a transaction that kept loading (a Spark micro-batch) grew quadratic.
    with db.connect(database_url) as conn:
        for table in ("queues", "tenants", "tenant_queues", "ready"):
            conn.execute(f"ANALYZE rota.{table}")
        load(conn, envelopes("first", 1))  # plans made now, on "empty" tables
        _flush_counts(conn)
        with conn.transaction():
            for chunk in range(4):
                batch = [e for t in range(200) for e in envelopes(f"c{chunk}-t{t}", 2)]
                assert db.run(conn, core.load(batch)) == 400
            read = _read_in_transaction(conn, ["tenants", "tenant_queues"])
    scans = {name: seq_scan for name, (seq_scan, _) in read.items()}
    # (rota.queues holds one row per queue: scanning it is cheap.)
    assert scans == {"tenants": 0, "tenant_queues": 0}, scans


def test_a_claim_planned_on_an_empty_queue_stays_on_its_indexes(database_url: str) -> None:
    # A worker's claim is a prepared statement with a generic plan, kept until
    # the next ANALYZE: planned while the queue was empty, it once sorted a
    # scan of all of ready (and read every tenant per task) on every claim.
    with db.connect(database_url) as conn:
        load(conn, envelopes("seed", 1))
        for table in ("ready", "tasks", "tenants", "queues", "running"):
            conn.execute(f"ANALYZE rota.{table}")
        for _ in range(8):  # psycopg prepares it after 5 runs
            db.transact(conn, core.claim(["default"], 100, "w"))
        load(conn, [e for t in range(200) for e in envelopes(f"t{t}", 50)])
        _flush_counts(conn)
        with conn.transaction():
            for _ in range(3):
                assert len(db.run(conn, core.claim(["default"], 100, "w"))) == 100
            read = _read_in_transaction(conn, ["ready", "tasks", "tenants"])
    assert {name: seq_scan for name, (seq_scan, _) in read.items()} == dict.fromkeys(
        ["ready", "tasks", "tenants"], 0
    ), read
    # Three claims of 100 tasks: about a row per task and table (as planned on
    # a full queue: 301, 301 and 703), not the 10k waiting, nor every tenant
    # per task (tens of thousands).
    fetched = {name: rows for name, (_, rows) in read.items()}
    assert fetched["ready"] <= 400 and fetched["tasks"] <= 400, read
    assert fetched["tenants"] <= 1000, read


def test_a_statement_left_with_a_sequential_scan_is_not_jit_compiled(database_url: str) -> None:
    # With sequential scans off, the one left (rota.running has no index on
    # queue_id) is costed past jit_above_cost: PostgreSQL JIT-compiled
    # queue_counts on every run, 130 ms for 1 ms of work.
    with db.connect(database_url) as conn:
        load(conn, envelopes("t", 10))
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query("queue_counts")).fetchone()
    assert "JIT" not in plan[0], plan[0]["JIT"]


def test_a_url_naming_its_own_options_gets_no_session_settings_from_rota(
    database_url: str,
) -> None:
    def settings(url: str) -> tuple[str, ...]:
        with db.connect(url, synchronous_commit=False) as conn:
            row = conn.execute(
                "SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'),"
                " current_setting('jit'), current_setting('synchronous_commit'),"
                " current_setting('work_mem')"
            ).fetchone()
        assert row is not None
        return tuple(row)

    default_work_mem = settings(database_url)[4]
    assert settings(database_url) == ("force_generic_plan", "off", "off", "off", default_work_mem)
    # Behind PgBouncer the settings live on the role; the URL's options are the user's.
    own = database_url + ("&" if "?" in database_url else "?") + "options=-c%20work_mem%3D1234kB"
    assert settings(own) == ("auto", "on", "on", "on", "1234kB")
