"""The round-trip count of `rota bench end-to-end` on made-up wire events."""

from __future__ import annotations

from rota_tools.bench.roundtrips import Path, Trip, notified, path_of, trips
from rota_tools.delay_proxy import Chunk


def test_a_request_in_several_chunks_and_its_answer_are_one_round_trip() -> None:
    events = [
        Chunk(1.0, 1, True),
        Chunk(1.1, 1, True),  # the rest of the same request
        Chunk(1.2, 1, False),
        Chunk(1.3, 1, False),  # the rest of the answer
        Chunk(2.0, 1, True),
        Chunk(2.5, 1, False),
    ]
    assert trips(events) == [Trip(1.0, 1.2, 1), Trip(2.0, 2.5, 1)]


def test_what_a_server_sends_unasked_is_no_round_trip_and_connections_are_apart() -> None:
    events = [
        Chunk(1.0, 2, False),  # a NOTIFY on a listening connection
        Chunk(1.5, 1, True),
        Chunk(1.6, 2, True),
        Chunk(1.7, 1, False),
        Chunk(1.9, 2, False),
    ]
    assert trips(events) == [Trip(1.5, 1.7, 1), Trip(1.6, 1.9, 2)]


def test_a_tasks_path_counts_each_stage_in_its_window() -> None:
    producer = [Trip(9.0, 9.1), Trip(10.0, 10.1)]  # the first is an earlier task's
    blocked_read = Trip(5.0, 10.2)  # sent before the enqueue, ended by it
    insert = Trip(10.3, 10.5)
    acknowledge = Trip(10.6, 10.8)  # after the commit: off the path
    claim = Trip(10.7, 10.9)
    heartbeat = Trip(20.0, 20.1)  # after the start
    path = path_of(
        enqueued=10.0,
        acknowledged=10.15,
        started=11.0,
        producer=producer,
        loader=[blocked_read, insert, acknowledge],
        loader_postgres=[insert],
        worker=[claim, heartbeat],
    )
    assert path == Path(producer=1, loader=2, worker=1)
    assert path is not None and path.total == 4


def test_no_path_without_a_worker_request_or_a_commit_in_the_window() -> None:
    assert path_of(10.0, 10.1, 11.0, [], [], [], []) is None
    assert path_of(10.0, 10.1, 11.0, [], [], [], [Trip(10.5, 10.6)]) is None


def test_the_loader_s_stage_ends_with_the_commit_whose_notify_wakes_the_worker() -> None:
    blocked_read = Trip(5.0, 10.2)
    insert = Trip(10.3, 10.5, 1)  # the commit: its NOTIFY reaches the worker at 10.51
    # The WAL flush before the buffer is acknowledged, on a connection of its own.
    flush = Trip(10.55, 10.6, 2)
    claim = Trip(10.7, 10.9)  # a worker slow to wake
    path = path_of(
        enqueued=10.0,
        acknowledged=10.15,
        started=11.0,
        producer=[Trip(10.0, 10.1)],
        loader=[blocked_read, insert, flush],
        loader_postgres=[insert, flush],
        worker=[claim],
        notifies=[9.5, 10.51],
    )
    assert path == Path(producer=1, loader=2, worker=1)
    # The NOTIFY late to the worker (10.57): the flush, sent before it, is
    # still no part of the load; nor without a NOTIFY, answered before the claim.
    late = path_of(
        10.0, 10.15, 11.0, [], [blocked_read, insert, flush], [insert, flush], [claim], [10.57]
    )
    assert late is not None and late.loader == 2
    slow = path_of(10.0, 10.15, 11.0, [], [blocked_read, insert, flush], [insert, flush], [claim])
    assert slow is not None and slow.loader == 2
    # A load of two statements on its connection counts both.
    prepare = Trip(10.25, 10.28, 1)
    copied = path_of(
        10.0,
        10.15,
        11.0,
        [],
        [blocked_read, prepare, insert, flush],
        [prepare, insert, flush],
        [claim],
        [10.57],
    )
    assert copied is not None and copied.loader == 3


def test_a_worker_request_before_the_notify_or_its_report_is_not_on_the_path() -> None:
    insert = Trip(10.3, 10.5)  # the commit: its NOTIFY reaches the worker at 10.51
    poll = Trip(10.2, 10.25)  # an idle poll while the task was still in the buffer
    heartbeat = Trip(10.4, 10.45)
    claim = Trip(10.52, 10.6)
    report = Trip(10.69, 10.75)  # the task's report, sent as it ends: after the start
    path = path_of(
        enqueued=10.0,
        acknowledged=10.15,
        started=10.7,
        producer=[Trip(10.0, 10.1)],
        loader=[Trip(5.0, 10.2), insert],
        loader_postgres=[insert],
        worker=[poll, heartbeat, claim, report],
        notifies=[10.51],
    )
    assert path == Path(producer=1, loader=2, worker=1)
    # Without the NOTIFY the poll would begin the worker's stage, before any
    # commit: no path is seen whole.
    assert path_of(10.0, 10.15, 10.7, [], [insert], [insert], [poll, heartbeat, claim]) is None


def test_a_notify_is_a_server_chunk_that_begins_a_notification() -> None:
    events = [
        Chunk(1.0, 2, False, b"A"),
        Chunk(1.5, 1, True, b"B"),
        Chunk(1.7, 1, False, b"2"),
    ]
    assert notified(events) == [1.0]
