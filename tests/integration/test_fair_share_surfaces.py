"""One history, every surface: the read model, the console's tenants list
and tenant page, `rota tenant list` and `show` (text and --json), the HTTP
API and the metrics give the same served, demand and fair share per minute,
and they are right.

The history is five whole minutes run through maintenance on a clock of the
test's (rota.count_service and rota.refresh_stats at chosen times): acme
sends a burst of 3,000 tasks and is served 500 a minute; b1, b2 and b3 send
20 a minute each and are served all of it, b1's last task of each of the
first four minutes arriving at the minute's end and served in the next, and
b2's last at the window's end, in flight."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from rota import Settings, core
from rota.core import db, history, read
from rota.core.history import FairShare
from tests.helpers import claim, envelopes, load, wait_for
from tests.integration.test_cli_errors import rota
from tests.integration.test_cli_operations import env_of, run_json
from tests.integration.test_dashboard import browser, console, http  # noqa: F401 (fixtures)

Conn = psycopg.Connection[Any]
SMALL = ("b1", "b2", "b3")
MINUTES = history.FAIR_MINUTES
# Per minute over the window: (served, fair share, demand, standing).
EXPECTED = {
    # 2,500 served of the 3,000 asked for, 500 unfinished at the end: 600 a
    # minute, not the ~2,000 a minute its backlog summed minute by minute
    # makes. Each minute's water-fill owed b1 (and b2, last) its task
    # unfinished at the minute's end, so acme's share came out 5 below what
    # it got: within rounding, at its fair share.
    "acme": (500.0, 500.0, 600.0, "at"),
    # Served what it asked for, tasks carried between minutes counted once.
    "b1": (19.8, 19.8, 19.8, "at"),
    # Its task in flight at the window's end: asked for, not yet served, and
    # not held back (its own pace finishes it within seconds).
    "b2": (20.0, 20.0, 20.2, "at"),
    "b3": (20.0, 20.0, 20.0, "at"),
}


def _run_minute(conn: Conn, minute: datetime, arrivals: dict[str, int], late: list[str]) -> None:
    """One minute of the history: the arrivals loaded, everything of the
    small tenants and 500 of acme's served halfway through, then a task of
    each tenant in `late` arriving, then maintenance counts at the minute's
    end."""
    batch = [e for name, n in arrivals.items() for e in envelopes(name, n)]
    if batch:
        load(conn, batch)
    ready = dict(
        conn.execute(
            "SELECT t.name, count(*) FROM rota.ready r JOIN rota.tenants t ON t.id = r.tenant_id"
            " GROUP BY t.name"
        ).fetchall()
    )
    wanted = {name: ready.get(name, 0) for name in SMALL} | {"acme": 500}
    got = claim(conn, sum(wanted.values()))
    served = {name: sum(1 for t in got if t.tenant == name) for name in wanted}
    assert served == wanted, (minute, served)  # fair order: the small tenants' turns come first
    db.transact(conn, core.complete([t.token for t in got]))
    conn.execute(
        "UPDATE rota.finished SET finished_at = %s WHERE task_id = ANY (%s)",
        (minute + timedelta(seconds=30), [t.id for t in got]),
    )
    if late:
        load(conn, [e for name in late for e in envelopes(name, 1)])
    end = minute + timedelta(seconds=59)
    db.run(conn, core.count_service(end))
    db.run(conn, core.refresh_stats(end))


def _history(conn: Conn) -> datetime:
    """Five whole minutes before the minute now; returns the minute now."""
    wait_for(lambda: datetime.now(UTC).second < 30, timeout=40, what="a minute's first half")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for k in range(MINUTES):
        # b1: 19 a minute, and one more at the end of each minute but the last.
        arrivals = {"b1": 19, "b2": 20, "b3": 20} | ({"acme": 3000} if k == 0 else {})
        late = ["b1"] if k < MINUTES - 1 else ["b2"]
        _run_minute(conn, now - timedelta(minutes=MINUTES - k), arrivals, late)
    return now


def _figures(served: str, fair: str, demand: str, standing: str) -> tuple[Any, ...]:
    return (
        float(served.replace(",", "")),
        float(fair.replace(",", "")),
        float(demand.replace(",", "")),
        standing,
    )


WORDING = re.compile(
    r"served ([0-9.,]+) of fair share ([0-9.,]+), demand ([0-9.,]+) \((\w+) its fair share\)"
)


def _worded(text: str) -> tuple[Any, ...]:
    found = WORDING.search(text)
    assert found, text
    return _figures(*found.groups())


def test_every_surface_shows_the_same_fair_share_and_demand(
    conn: Conn,
    settings: Settings,
    http: httpx.Client,  # noqa: F811
    browser: httpx.Client,  # noqa: F811
) -> None:
    for name in ("acme", *SMALL):  # the tenants exist, in this order of slots
        db.transact(conn, core.configure_tenant(name, weight=1))
    now = _history(conn)

    # The read model's one definition.
    fair = db.run(conn, history.fair_shares(["acme", *SMALL]))
    assert {
        name: (f.served_per_minute, f.fair_share_per_minute, f.demand_per_minute, f.standing)
        for name, f in fair.items()
    } == EXPECTED
    assert all(isinstance(f, FairShare) and f.minutes == MINUTES for f in fair.values())
    # What the minutes' water-fill owed acme, before the rule: 5 below.
    raw = conn.execute(
        "SELECT sum(m.fair_share) FROM rota.tenant_minutes("
        " ARRAY(SELECT id FROM rota.tenants WHERE name = 'acme'),"
        " %(now)s - interval '5 minutes', %(now)s) m",
        {"now": now},
    ).fetchone()
    assert raw == (2495.0,)
    page = db.run(conn, read.tenants(sort="served"))
    assert [t.name for t in page.rows] == ["acme", "b2", "b3", "b1"]  # by served
    rows = {t.name: t for t in page.rows}
    detail = {name: db.run(conn, read.tenant(name)) for name in EXPECTED}

    def model(t: Any) -> tuple[Any, ...]:
        return (t.served_per_minute, t.fair_share_per_minute, t.demand_per_minute, t.fair_standing)

    assert {name: model(t) for name, t in rows.items()} == EXPECTED
    assert {name: model(t) for name, t in detail.items()} == EXPECTED

    # The console: the tenants list and each tenant's page, in one wording.
    listing = browser.get("/tenants").text
    cells = {
        name: re.search(
            rf'<a href="/tenants/{name}">{name}</a>.*?<td class="fair[^"]*" '
            r'data-standing="(\w+)">([^<]*)</td>',
            listing,
            re.S,
        )
        for name in EXPECTED
    }
    assert all(cells.values()), listing
    assert {name: _worded(c[2]) for name, c in cells.items() if c} == EXPECTED
    assert {name: c[1] for name, c in cells.items() if c} == {n: "at" for n in EXPECTED}
    assert f"per minute, last {MINUTES} whole minutes" in listing
    for name, expected in EXPECTED.items():
        shown = browser.get(f"/tenants/{name}").text
        card = re.search(r'<b id="fair-share" data-standing="(\w+)">([^<]*)</b>', shown)
        assert card and _worded(card[2]) == expected and card[1] == expected[3], name
        # The words are the list's, to the character.
        assert cells[name] and card[2] == cells[name][2]

    # `rota tenant list` and `show`, text and JSON.
    env = env_of(settings)
    text = rota("tenant", "list", **env)
    assert text.returncode == 0, text.stderr
    for name, expected in EXPECTED.items():
        (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith(f"{name} ")]
        assert _worded(line) == expected, line
        assert cells[name] and cells[name][2] in line
    listed = run_json(settings, "tenant", "list")
    assert {t["name"]: model_of(t) for t in listed["rows"]} == EXPECTED
    shown_text = rota("tenant", "show", "acme", **env)
    assert shown_text.returncode == 0 and _worded(shown_text.stdout) == EXPECTED["acme"]
    assert shown_text.stdout.startswith("tenant acme: ")  # no internal id (its slot) shown
    assert model_of(run_json(settings, "tenant", "show", "acme")) == EXPECTED["acme"]

    # The HTTP API.
    api = http.get("/api/tenants").json()
    assert api["fair_minutes"] == MINUTES
    assert {t["name"]: model_of(t) for t in api["tenants"]} == EXPECTED
    for name, expected in EXPECTED.items():
        assert model_of(http.get(f"/api/tenants/{name}").json()["tenant"]) == expected

    # The metrics: the top tenants by waiting (acme, 500 left; b2, 1) as gauges.
    samples = {
        (s.name, s.labels.get("tenant")): s.value
        for f in text_string_to_metric_families(http.get("/metrics").text)
        for s in f.samples
        if s.name.startswith("rota_tenant_") and s.name.endswith("_per_minute")
    }
    for name in ("acme", "b2"):
        served, owed, asked, _ = EXPECTED[name]
        assert samples[("rota_tenant_served_per_minute", name)] == served
        assert samples[("rota_tenant_fair_share_per_minute", name)] == owed
        assert samples[("rota_tenant_demand_per_minute", name)] == asked
    assert ("rota_tenant_served_per_minute", "b1") not in samples  # nothing waits: not a top one

    # All of it read within the minute the window ends at.
    assert datetime.now(UTC).replace(second=0, microsecond=0) == now, "crossed a minute's end"


def model_of(t: dict[str, Any]) -> tuple[Any, ...]:
    return (
        t["served_per_minute"],
        t["fair_share_per_minute"],
        t["demand_per_minute"],
        t["fair_standing"],
    )
