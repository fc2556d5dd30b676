"""`rota dev`: the embedded PostgreSQL and Redis in the foreground, their
URLs in .env so that rota's commands work in the directory with nothing
exported; SIGTERM stops both (kill -9 too); a second run keeps the data; a
second one beside a running one says what to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.docs_examples import ROOT


def _env() -> dict[str, str]:
    """No ROTA_* of the suite: only what `rota dev` writes to .env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    return {**env, "PYTHONPATH": str(ROOT)}


def _rota(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rota", *args],
        cwd=directory,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


class Dev:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.out = directory / "dev.out"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rota", "dev"],
            cwd=directory,
            env=_env(),
            stdout=open(self.out, "w"),  # noqa: SIM115 - the child's for its lifetime
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.out.read_text()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while "ready:" not in self.output():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Dev]:
    dev = Dev(tmp_path)
    try:
        dev.wait_ready()
        yield dev
    finally:
        dev.stop()


def _urls(directory: Path) -> dict[str, str]:
    lines = (directory / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("ROTA_"))


def _postmaster(directory: Path) -> int:
    return int((directory / ".rota" / "postgres" / "postmaster.pid").read_text().split()[0])


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


@pytest.mark.slow(reason="starts and stops the embedded servers twice (initdb, migrate)")
def test_rota_dev_serves_the_directory_and_keeps_its_data(tmp_path: Path, started: Dev) -> None:
    assert "for development only" in started.output()
    urls = _urls(tmp_path)
    assert set(urls) == {"ROTA_DATABASE_URL", "ROTA_REDIS_URL"}
    # Commands in the directory find the servers through .env alone.
    assert _rota(tmp_path, "tenant", "set", "acme", "--weight", "3").returncode == 0
    redis.Redis.from_url(urls["ROTA_REDIS_URL"]).set("kept", "yes")
    postgres_pid = _postmaster(tmp_path)

    assert started.stop() == 0
    assert "stopped both servers" in started.output()
    assert not _alive(postgres_pid)
    assert not (tmp_path / ".rota" / "postgres" / "postmaster.pid").exists()

    again = Dev(tmp_path)
    try:
        again.wait_ready()
        assert _urls(tmp_path) == urls  # the same ports, when free
        shown = _rota(tmp_path, "tenant", "show", "acme", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["weight"] == 3
        client = redis.Redis.from_url(urls["ROTA_REDIS_URL"])
        assert client.get("kept") == b"yes"
        servers = [_postmaster(tmp_path), int(client.info("server")["process_id"])]
        # Killed, not stopped: its servers follow it all the same.
        again.process.kill()
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in servers):
            assert time.monotonic() < deadline, servers
            time.sleep(0.05)
    finally:
        again.stop()


def test_a_second_rota_dev_beside_a_running_one_says_so(tmp_path: Path, started: Dev) -> None:
    second = _rota(tmp_path, "dev")
    assert second.returncode == 2, second.stdout + second.stderr
    assert "still runs on" in second.stderr and "Traceback" not in second.stderr
    assert started.process.poll() is None  # the first one serves on
