"""Bad input to the console is a 4xx, never a 500, and changes nothing:
malformed tokens, ids, names, dates, pages and bodies sent to every
endpoint of the real app, over a real PostgreSQL and Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from rota import Settings
from rota.dashboard.app import create_app
from tests.helpers import envelopes, load

TOKEN = "fuzz-token-0123456789"
Conn = psycopg.Connection[Any]

READS = [
    "/api/overview",
    "/api/tenants",
    "/api/tenants/{}",
    "/api/tasks",
    "/api/tasks/{}",
    "/api/workers",
    "/api/dead-letters",
    "/",
    "/tenants",
    "/tenants/{}",
    "/tasks",
    "/tasks/{}",
    "/workers",
    "/dead-letters",
    "/find",
]
ACTIONS = [
    "/api/tasks",
    "/api/tasks/{}/cancel",
    "/api/tasks/{}/retry",
    "/api/tasks/cancel",
    "/api/tasks/retry",
    "/api/dead/retry",
    "/api/queues/{}/pause",
    "/api/queues/{}/resume",
    "/api/tenants/{}/pause",
    "/api/tenants/{}",
    "/api/dead-letters/replay",
    "/api/dead-letters/purge",
]
PARAMS = [
    "page",
    "per_page",
    "sort",
    "order",
    "prefix",
    "state",
    "tenant",
    "queue",
    "limit",
    "before",
    "id",
    "next",
    "done",
]

# Text that no rule accepts as a task id, queue or tenant name (it holds a
# character none allows), but otherwise anything.
bad_names = st.text(min_size=0, max_size=300).map(lambda t: t + " ~\u00e9")
numbers_as_text = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["1e309", "nan", "-inf", "0x10", "", " ", "10" * 40, "1.5"]),
)
param_values = st.one_of(st.text(max_size=200), numbers_as_text)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=False),
        st.text(max_size=50),
    ),
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5)
    ),
    max_leaves=30,
)
# Bodies no endpoint accepts: not JSON, or JSON of the wrong shape, or far too deep.
bad_bodies = st.one_of(
    st.binary(max_size=200).filter(lambda b: not b.strip().startswith((b"{", b"["))),
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.dictionaries(
        st.sampled_from(
            [
                "ids",
                "name",
                "queue",
                "tenant",
                "all",
                "eta",
                "args",
                "weight",
                "concurrency_limit",
                "rate_limit",
                "capacity",
                "countdown",
            ]
        ),
        st.one_of(bad_names, st.integers(min_value=10**20, max_value=10**30), st.just([[[]]])),
        min_size=1,
    ).map(lambda d: json.dumps(d).encode()),
    st.integers(min_value=50, max_value=3000).map(lambda n: ("[" * n + "]" * n).encode()),
)
tokens = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=100),
    st.just(TOKEN[:-1]),
)


@pytest.fixture
def client(database_url: str, redis_url: str) -> Iterator[TestClient]:
    app = create_app(
        Settings(database_url=database_url, redis_url=redis_url, dashboard_token=TOKEN)
    )
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _snapshot(conn: Conn) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM rota.tasks), (SELECT count(*) FROM rota.ready),"
        " (SELECT count(*) FROM rota.running), (SELECT count(*) FROM rota.scheduled),"
        " (SELECT count(*) FROM rota.audit), (SELECT count(*) FROM rota.queues WHERE paused),"
        " (SELECT count(*) FROM rota.tenants),"
        " (SELECT coalesce(sum(weight), 0) FROM rota.tenants WHERE concurrency_limit IS NULL),"
        " (SELECT string_agg(status::text, ',' ORDER BY id) FROM rota.tasks)"
    ).fetchone()
    assert row is not None
    return tuple(row)


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(
    path=st.sampled_from(READS),
    name=bad_names,
    params=st.dictionaries(st.sampled_from(PARAMS), param_values, max_size=4),
)
def test_reads_answer_bad_input_with_a_4xx(
    client: TestClient, conn: Conn, path: str, name: str, params: dict[str, str]
) -> None:
    if not conn.execute("SELECT 1 FROM rota.tasks LIMIT 1").fetchone():
        load(conn, envelopes("alice", 3))
    before = _snapshot(conn)
    answer = client.get(
        path.format(quote(name, safe="")),
        params=params,
        headers={"Authorization": f"Bearer {TOKEN}"},
        follow_redirects=False,
    )
    assert answer.status_code < 500, (path, name, params, answer.text[:500])
    assert _snapshot(conn) == before


@pytest.mark.parametrize("page", ["1000000000000000000", "-1", "0"])
def test_an_absurd_page_is_a_400(client: TestClient, page: str) -> None:
    """Found by the fuzzing above: a page past a bigint's offset was a 500."""
    answer = client.get(
        "/api/tenants", params={"page": page}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 400, answer.text[:300]


@pytest.mark.parametrize("value", ["\x00", "a\x00"])
def test_a_nul_in_any_parameter_of_any_read_is_a_400(
    client: TestClient, conn: Conn, value: str
) -> None:
    """Found by the fuzzing above: a tenant prefix holding NUL, which no text
    column holds, was a 500."""
    load(conn, envelopes("alice", 1))
    answers = {
        (path, param): client.get(
            path.format("alice"),
            params={param: value},
            headers={"Authorization": f"Bearer {TOKEN}"},
            follow_redirects=False,
        ).status_code
        for path in READS
        for param in PARAMS
    }
    assert not {k: v for k, v in answers.items() if v >= 500}
    assert answers["/api/tenants", "prefix"] == 400


@FUZZ
@given(path=st.sampled_from(ACTIONS), name=bad_names, body=bad_bodies)
def test_actions_refuse_bad_input_and_change_nothing(
    client: TestClient, conn: Conn, path: str, name: str, body: bytes
) -> None:
    if not conn.execute("SELECT 1 FROM rota.tasks LIMIT 1").fetchone():
        load(conn, envelopes("alice", 3))
    before = _snapshot(conn)
    answer = client.post(
        path.format(quote(name, safe="")),
        content=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert answer.status_code < 500, (path, name, body[:200], answer.text[:500])
    assert _snapshot(conn) == before


@FUZZ
@given(token=tokens, path=st.sampled_from([*READS, "/metrics"]))
def test_a_wrong_token_of_any_characters_is_a_401(
    client: TestClient, token: str, path: str
) -> None:
    answer = client.get(
        path.format("x"),
        headers={"Authorization": f"Bearer {token}".encode("latin-1")},  # type: ignore[dict-item]
        follow_redirects=False,
    )
    assert answer.status_code in (401, 303), (token, answer.text[:300])
    login = client.post("/login", data={"token": token}, follow_redirects=False)
    assert login.status_code in (401, 429)
