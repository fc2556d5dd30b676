"""A loader that stops dead at a chosen point, for kill -9 tests.

    python loader_child.py before-commit|before-ack

Prints "ready" when it holds the entries at that point, then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rota import Settings
from rota.loader import engine


def _hang(*_: Any) -> Any:
    print("ready", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    stage = sys.argv[1]
    if stage == "before-commit":
        engine.load_entries = _hang
    elif stage == "before-ack":
        original = engine.Loader._finish

        def finish_never(self: engine.Loader, *args: Any) -> None:
            _hang()

        engine.Loader._finish = finish_never  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown stage {stage}")
    engine.Loader(Settings(), consumer="doomed").drain()
