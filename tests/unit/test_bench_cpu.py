"""The benchmarks' CPU accounting: per process from /proc, children included."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from rota_tools.bench.cpu import (
    CpuMeter,
    pid_probe,
    process_seconds,
    process_tree_seconds,
    tree_probe,
)
from rota_tools.devservers import descendants


@contextlib.contextmanager
def _python(script: str, says: bytes) -> Iterator[subprocess.Popen[bytes]]:
    """A Python process running `script`, once it has printed the line
    `says`; killed afterwards, with whatever it started."""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == says + b"\n"
        yield parent
    finally:
        for pid in descendants(parent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        parent.kill()
        parent.wait()


def _spin(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_a_process_cpu_seconds_follow_the_work_it_does() -> None:
    before = process_seconds(os.getpid())
    _spin(0.3)
    after = process_seconds(os.getpid())
    assert before is not None and after is not None
    assert 0.2 <= after - before <= 5, (before, after)


def test_a_process_cpu_seconds_count_its_other_threads() -> None:
    # A worker runs its tasks in a pool's threads, not in its main thread.
    before = process_seconds(os.getpid())
    spinner = threading.Thread(target=_spin, args=(0.3,))
    spinner.start()
    spinner.join()
    after = process_seconds(os.getpid())
    assert before is not None and after is not None
    assert 0.2 <= after - before <= 5, (before, after)


def test_a_few_milliseconds_of_work_are_measured_finer_than_a_clock_tick() -> None:
    # A proxy's share of a short benchmark can be under a tick (10 ms).
    before = process_seconds(os.getpid())
    _spin(0.002)
    after = process_seconds(os.getpid())
    assert before is not None and after is not None
    assert 0.0015 <= after - before < 0.009, (before, after)


def test_a_process_tree_counts_children_that_have_exited() -> None:
    # A server's backends come and go: what an exited child used still counts.
    script = (
        "import subprocess, sys, time;"
        "subprocess.run([sys.executable, '-c', "
        "'import time\\nt = time.process_time() + 0.5\\nwhile time.process_time() < t: pass']);"
        "print('done', flush=True); time.sleep(30)"
    )
    with _python(script, b"done") as parent:
        own = process_seconds(parent.pid)
        tree = process_tree_seconds(parent.pid)
        assert own is not None and tree is not None
        assert tree - own >= 0.4, (own, tree)


def test_a_tree_probe_counts_a_grandchild_that_still_runs() -> None:
    # A Spark driver's JVM starts a Python daemon, which forks the workers
    # that stay (reused): their CPU is the tree's.
    script = (
        "import subprocess, sys;"
        "subprocess.run([sys.executable, '-c', "
        "'import time\\nt = time.process_time() + 0.5\\nwhile time.process_time() < t: pass"
        "\\nprint(1, flush=True)\\ntime.sleep(30)'])"
    )
    with _python(script, b"1") as parent:
        assert len(descendants(parent.pid)) == 1
        own = process_seconds(parent.pid)
        tree = tree_probe(parent.pid)()
        assert own is not None and tree is not None
        assert tree - own >= 0.4, (own, tree)


def test_a_process_that_is_gone_is_not_measured() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_seconds(gone.pid) is None


def test_the_meter_reports_seconds_and_cores_per_process_and_names_the_busiest() -> None:
    clock = {"a": 1.0, "b": 10.0}
    meter = CpuMeter(
        {"a": lambda: clock["a"], "b": lambda: clock["b"], "remote": None, "self": pid_probe(0)}
    )
    meter.start()
    clock["a"], clock["b"] = 3.0, 10.5
    report = meter.report(elapsed=2.0)
    assert report["per_process"] == {
        "a": {"seconds": 2.0, "cores": 1.0},
        "b": {"seconds": 0.5, "cores": 0.25},
    }
    assert report["all_cores"] == 1.25
    assert report["busiest"] == "a"
    assert report["not_measured"] == ["remote"]
    assert "all_us_per_task" not in report


def test_the_meter_gives_each_process_cpu_per_task_when_told_the_tasks() -> None:
    clock = {"a": 1.0, "b": 10.0}
    meter = CpuMeter({"a": lambda: clock["a"], "b": lambda: clock["b"]})
    meter.start()
    clock["a"], clock["b"] = 1.3, 10.05
    report = meter.report(elapsed=2.0, tasks=10_000)
    assert report["per_process"]["a"]["us_per_task"] == 30.0
    assert report["per_process"]["b"]["us_per_task"] == 5.0
    assert report["all_us_per_task"] == 35.0


def test_the_meter_keeps_a_few_milliseconds() -> None:
    clock = {"proxy": 1.0}
    meter = CpuMeter({"proxy": lambda: clock["proxy"]})
    meter.start()
    clock["proxy"] += 0.0031
    assert meter.report(elapsed=1.0)["per_process"]["proxy"]["seconds"] == 0.0031


def test_a_tree_read_while_children_end_never_goes_back() -> None:
    # A server's backends end and are waited for at any moment, a probe's
    # read among them: a child gone before its own read but after its
    # parent's record of waited-for children was read would lose its whole
    # life's CPU from the figure (and one read the other way round count it
    # twice), so a tree's CPU seconds would fall. They never may; rounding to
    # clock ticks (10 ms) a child's end moves them by less than a tick.
    script = (
        "import os, time\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        t = time.process_time() + 0.03\n"
        "        while time.process_time() < t: pass\n"
        "        os._exit(0)\n"
        "    os.waitpid(child, 0)\n"
    )
    with _python(script, b"up") as parent:
        reads = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            seconds = process_tree_seconds(parent.pid)
            assert seconds is not None
            reads.append(seconds)
        falls = [(a, b) for a, b in itertools.pairwise(reads) if b < a - 0.011]
        assert len(reads) > 100 and not falls, falls[:5]
        assert reads[-1] - reads[0] >= 1.0  # the children's work was counted
