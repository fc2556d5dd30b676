"""The app `rota bench work` runs workers with: a task that does nothing."""

import rota

app = rota.App.from_env()


@app.task(queue="bench")
def noop(*args: object) -> None:
    """Nothing: the benchmark measures rota's own overhead."""
