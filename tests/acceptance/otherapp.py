"""A second service's app: its task shares the queue `work` with workapp's."""

from __future__ import annotations

import rota

app = rota.App.from_env()


@app.task(name="other.task", queue="work")
def other_task(note: str) -> None: ...
