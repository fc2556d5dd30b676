"""`rota bench fleet`'s parts that need no server: its options, its tenants,
and the ratios it reads off the systems' figures."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rota_tools.bench.fleet import (
    QUIET_RANK,
    SYSTEMS,
    TENANTS,
    parse_handlers,
    parse_systems,
    ratios,
    zipf_tenant,
)


def test_handlers_are_processes_by_threads() -> None:
    assert parse_handlers("8x32") == (8, 32)
    assert parse_handlers("2X4") == (2, 4)
    for wrong in ("8", "8x", "x32", "0x4", "8*32", "-1x2"):
        with pytest.raises(ValueError):
            parse_handlers(wrong)


def test_systems_run_in_their_fixed_order_and_unknown_ones_are_refused() -> None:
    assert parse_systems("pgqueuer, rota") == ["rota", "pgqueuer"]
    assert parse_systems(",".join(reversed(SYSTEMS))) == list(SYSTEMS)
    for wrong in ("", "rota,celery"):
        with pytest.raises(ValueError):
            parse_systems(wrong)


def test_tenants_are_drawn_zipf_from_a_thousand() -> None:
    rng = random.Random(1)
    drawn = Counter(zipf_tenant(rng) for _ in range(50_000))
    assert all(len(t) == 5 and 0 <= int(t[1:]) < TENANTS for t in drawn)
    # s = 1 over 1,000: the first tenant holds 1 / H(1000), about 13%, the
    # second half as much; the quiet ones each well under 1%.
    assert drawn["t0000"] / 50_000 == pytest.approx(0.134, abs=0.01)
    assert drawn["t0001"] / drawn["t0000"] == pytest.approx(0.5, abs=0.06)
    quiet = [n for t, n in drawn.items() if int(t[1:]) >= QUIET_RANK]
    assert max(quiet) / 50_000 < 0.002


def _system(cpu: float | None, p99: float) -> dict[str, object]:
    return {"postgres_cpu_us_per_task": cpu, "handler_ms": {"p99": p99}}


def _swept(rate: float) -> dict[str, object]:
    return {"rate_per_s": rate, "runs": [{"offered_per_s": rate}]}


def test_ratios_are_rotas_figures_over_its_direct_path_and_the_best_peer() -> None:
    systems = {
        "rota": _system(20.0, 2.0),
        "rota_direct": _system(200.0, 40.0),
        "pgqueuer": _system(80.0, 10.0),
        "procrastinate": _system(100.0, 8.0),
        "insert_per_request": _system(10.0, 1.0),  # the floor: no peer
    }
    sweep = {
        "rota": _swept(4000),
        "pgqueuer": _swept(1000),
        "procrastinate": _swept(500),
        "insert_per_request": _swept(8000),
    }
    assert ratios(systems, sweep) == {
        "postgres_cpu_to_rota_direct": 0.1,
        "postgres_cpu_to_best_peer": 0.25,  # the lower CPU: pgqueuer's
        "handler_p99_to_best_peer": 0.25,  # the lower p99: procrastinate's
        "sweep_rate_to_best_peer": 4.0,  # the higher rate: pgqueuer's
    }


def test_a_ratio_without_its_figures_is_none() -> None:
    systems = {"rota": _system(20.0, 2.0), "pgqueuer": _system(None, 10.0)}
    sweep = {"rota": _swept(1000), "pgqueuer": _swept(0)}  # no rate passed
    assert ratios(systems, sweep) == {
        "postgres_cpu_to_rota_direct": None,
        "postgres_cpu_to_best_peer": None,
        "handler_p99_to_best_peer": 0.2,
        "sweep_rate_to_best_peer": None,
    }
    assert ratios({"pgqueuer": _system(1.0, 1.0)}, {}) == {}  # rota not run
