"""SIGTERM and SIGINT reach rota's processes through rota.runtime.process.on_stop_signals."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.helpers import start_logged, wait_for

# A loop that holds its Event's lock most of the time, as a busy worker's does
# (Event.clear between claims). A Python signal handler that set that Event
# deadlocked such a process on itself in 12 of 30 tries.
BUSY_LOOP = """
import threading
from rota.runtime.process import on_stop_signals

wake, stopping = threading.Event(), threading.Event()

def stop():
    stopping.set()
    wake.set()

on_stop_signals(stop)
print("ready", flush=True)
while not stopping.is_set():
    wake.clear()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_never_deadlocks_a_busy_process(signum: int) -> None:
    for _ in range(10):
        with start_logged([sys.executable, "-c", BUSY_LOOP]) as process:  # killed on the way out
            wait_for(
                lambda: "\n" in process.output() or process.poll() is not None,
                what="the busy loop's first line",
            )
            assert process.output() == "ready\n", process.errors()
            assert process.stop(signum, timeout=10) == 0, process.errors()
