"""The app `rota bench work` runs workers with: a task that does nothing."""

import rota

app = rota.App.from_env()


@app.task(queue="bench")
def noop(*args: object) -> None:
    """Nothing: the benchmark measures rota's own overhead."""


@app.task(queue="bench", result_ttl=600)
def noop_result(*args: object) -> int:
    """Nothing, and a result kept: what keeping results costs."""
    return 1
