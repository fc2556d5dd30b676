"""When a ready task should start (rota.readmodel.story.estimate): its place
in line at its queue's recent completion rate, said as an estimate, and no
estimate (said so) when the rate says nothing."""

from __future__ import annotations

from rota.core.read import QueuePace
from rota.readmodel.story import PACE_MINUTES, estimate, said
from tests.unit.test_dashboard_logic import stored

# 600 completions over five minutes: 120 a minute, counted 3 s ago.
PACE = QueuePace(completed=600, seconds=300.0, counted_seconds_ago=3.0)


def test_the_start_is_the_tasks_ahead_at_the_queues_recent_rate() -> None:
    start = estimate(stored(ahead=80), PACE)
    assert start.per_minute == 120 and start.minutes == PACE_MINUTES == 5
    assert start.seconds == 40
    assert said(start) == (
        "estimated start: in about 40 s (80 tasks ahead, at its queue's "
        "last-5-minutes rate of 120/min)"
    )
    deep = said(estimate(stored(ahead=640_000, ahead_estimated=True), PACE), True)
    assert deep.startswith("estimated start: in about 88.9 h (about 640,000 tasks ahead")
    assert said(estimate(stored(ahead=0), PACE)) == (
        "estimated start: it is next in line (at its queue's last-5-minutes rate of 120/min)"
    )
    assert said(estimate(stored(ahead=1), PACE)).startswith("estimated start: in under a second")


def test_no_estimate_when_the_rate_says_nothing_or_the_task_is_held_back() -> None:
    idle = QueuePace(completed=0, seconds=300.0, counted_seconds_ago=3.0)
    start = estimate(stored(ahead=80), idle)
    assert start.seconds is None
    assert said(start) == (
        "no estimate of when it starts: nothing in queue pdfs completed in the last 5 minutes"
    )
    stale = QueuePace(completed=600, seconds=300.0, counted_seconds_ago=600.0)
    assert "last counted 10.0 min ago (is maintenance running?)" in said(estimate(stored(), stale))
    assert "never counted" in said(estimate(stored(), None))
    for held in (
        stored(queue_paused=True),
        stored(concurrency_limit=5, tenant_running=5),
        stored(rate_limit=2.0, tokens=0.5),
        stored(queue_workers=0),
    ):
        assert said(estimate(held, PACE)) == ("no estimate of when it starts: it is held back")
