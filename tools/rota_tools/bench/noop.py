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


@app.task(queue="bench")
def noop_progress(*args: object) -> None:
    """Nothing but a progress report (`rota bench work --progress`)."""
    rota.context().progress(1, 1, "done")


@app.task(queue="bench", result_ttl=600)
def noop_result_progress(*args: object) -> int:
    """A progress report, and a result kept."""
    rota.context().progress(1, 1, "done")
    return 1


@app.task(queue="bench")
def spin(seconds: float) -> None:
    """Busy for `seconds` unless cancelled: looks every millisecond."""
    import time

    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        rota.context().raise_if_cancelled()
        time.sleep(0.001)


@app.task(queue="bench")
async def async_spin(seconds: float) -> None:
    """Waits `seconds`, cancelled at its await."""
    import asyncio

    await asyncio.sleep(seconds)


@app.task(queue="bench")
def crunch(rounds: int) -> int:
    """Pure-Python arithmetic, `rounds` steps: CPU-bound, holding the GIL."""
    total = 0
    for i in range(rounds):
        total = (total + i * i) % 1_000_003
    return total


@app.task(queue="bench")
def gathered(results: list[object]) -> None:
    """A workflow's join: nothing but receiving its members' results."""


@app.task(queue="bench")
def sleep_ms(milliseconds: float) -> None:
    """Holds its worker slot for `milliseconds` (runtime fairness)."""
    import time

    time.sleep(milliseconds / 1000)


@app.task(queue="bench", limit=rota.Limit("bench-key"))
def keyed(seconds: float) -> None:
    """Calls a downstream every tenant shares (`rota bench keyed-limits` sets its limit)."""
    import time

    time.sleep(seconds)
