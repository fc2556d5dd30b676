"""The CLI's expected errors: one line that says what to do, exit code 2, no
traceback without --debug, never a password."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
PASSWORD = "s3cret-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_password(url: str) -> str:
    """The URL with a user and password the server ignores (trust auth)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def rota(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rota", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 2, result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert says in lines[0], lines[0]


def test_server_down(redis_url: str) -> None:
    down = f"postgresql://rota:{PASSWORD}@127.0.0.1:{_free_port()}/rota"
    _one_line(rota("tenant", "alice", ROTA_DATABASE_URL=down), "cannot reach PostgreSQL")
    redis_down = f"redis://:{PASSWORD}@127.0.0.1:{_free_port()}/0"
    result = rota("dead-letters", "list", ROTA_DATABASE_URL=down, ROTA_REDIS_URL=redis_down)
    _one_line(result, "cannot reach Redis")


def test_a_database_that_does_not_exist_is_named_with_the_fix(database_url: str) -> None:
    missing = _with_password(database_url).rsplit("/", 1)[0] + "/no_such_db"
    result = rota("tenant", "alice", ROTA_DATABASE_URL=missing)
    _one_line(result, "check the role and database names in ROTA_DATABASE_URL")
    assert "no_such_db" in result.stderr


def test_schema_not_migrated(empty_database_url: str) -> None:
    url = _with_password(empty_database_url)
    _one_line(rota("tenant", "alice", ROTA_DATABASE_URL=url), "run `rota migrate`")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("tenant", "alice", "--rate-limit", "inf"), "rate_limit must be"),
        (("tenant", "alice", "--weight", "0"), "weight must be"),
        (("tenant", "alice\n"), "tenant name"),
        (("limit", "set", "Stripe", "--concurrency", "2"), "limit name"),
        (("limit", "set", "stripe", "--burst", "3"), "burst= needs rate="),
    ],
)
def test_bad_input(database_url: str, args: tuple[str, ...], says: str) -> None:
    _one_line(rota(*args, ROTA_DATABASE_URL=_with_password(database_url)), says)


def test_bad_url_and_bad_setting() -> None:
    _one_line(rota("tenant", "a", ROTA_DATABASE_URL=f"nonsense {PASSWORD}"), "not a valid")
    _one_line(rota("tenant", "a", ROTA_SHARDS="0"), "ROTA_SHARDS")


def test_unknown_app_and_bad_option(database_url: str) -> None:
    result = rota("worker", "--app", "no.such.module:app", ROTA_DATABASE_URL=database_url)
    assert result.returncode == 2 and "cannot load the app" in result.stderr
    assert "Traceback" not in result.stderr
    result = rota("tenant", "alice", "--capacity", "1e20", ROTA_DATABASE_URL=database_url)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_debug_shows_the_traceback_without_locals() -> None:
    down = f"postgresql://rota:{PASSWORD}@127.0.0.1:{_free_port()}/rota"
    result = rota("--debug", "tenant", "alice", ROTA_DATABASE_URL=down)
    assert result.returncode != 0
    assert "Traceback" in result.stderr or "OperationalError" in result.stderr
    assert PASSWORD not in result.stderr


def test_a_console_token_is_made_once_and_only_its_hash_kept(tmp_path: Path) -> None:
    from rota.dashboard.auth import read_tokens, token_hash

    made = rota("dashboard-token", "wall", "--scopes", "metrics,read")
    assert made.returncode == 0, made.stderr
    token = made.stderr.split("token (shown once): ", 1)[1].split()[0]
    line = made.stdout.strip()
    assert token not in line and line.endswith(token_hash(token))
    (tmp_path / "tokens").write_text(line + "\n")
    (principal,) = read_tokens(tmp_path / "tokens").values()
    assert principal.name == "wall" and principal.scopes == {"read", "metrics"}
    bad = rota("dashboard-token", "wall", "--scopes", "root")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "scopes must be some of read, enqueue, act, metrics" in bad.stderr
    (tmp_path / "broken").write_text("wall read\n")
    refused = rota(
        "dashboard",
        "--host",
        "0.0.0.0",
        "--port",
        str(_free_port()),
        ROTA_CONSOLE_TOKENS_FILE=str(tmp_path / "broken"),
        ROTA_DATABASE_URL="postgresql://rota@127.0.0.1:1/x",
    )
    assert refused.returncode == 2 and "broken:1: expected `NAME SCOPES SHA256`" in refused.stderr


def test_urls_from_files_and_a_warning_for_a_password_in_argv(tmp_path: Path) -> None:
    down = f"postgresql://rota:{PASSWORD}@127.0.0.1:{_free_port()}/rota"
    (tmp_path / "db").write_text(down + "\n")
    from_file = rota("tenant", "alice", ROTA_DATABASE_URL_FILE=str(tmp_path / "db"))
    _one_line(from_file, "cannot reach PostgreSQL")  # the file's URL was used
    missing = rota("tenant", "alice", ROTA_DATABASE_URL_FILE=str(tmp_path / "nothing"))
    _one_line(missing, "ROTA_DATABASE_URL_FILE: cannot read")
    in_argv = rota("tenant", "alice", "--database-url", down)
    assert in_argv.returncode == 2 and PASSWORD not in in_argv.stderr
    assert "a password on the command line shows in `ps`" in in_argv.stderr


def test_stored_errors_are_redacted_and_printed_without_terminal_control(
    database_url: str,
) -> None:
    import psycopg

    from rota import core
    from rota.core import db
    from tests.helpers import claim, envelopes, load

    with psycopg.connect(database_url, autocommit=True) as conn:
        load(conn, envelopes("alice", 1))
        (task,) = claim(conn, 1)
        error = f"cannot reach postgresql://u:{PASSWORD}@db/x \x1b[2J\x1b[31mred"
        trace = f'  File "t.py", line 1\n    connect("redis://:{PASSWORD}@h:6379")\n'
        db.transact(
            conn,
            core.fail([core.Failure(task.id, task.attempt, error, final=True, traceback=trace)]),
        )
        stored = conn.execute(
            "SELECT last_error, traceback FROM rota.tasks WHERE id = %s", [task.id]
        ).fetchone()
    assert stored is not None and PASSWORD not in stored[0] + stored[1]
    assert "postgresql://u:***@db/x" in stored[0]
    shown = rota("task", "show", str(task.id), ROTA_DATABASE_URL=database_url)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "red" in shown.stdout


def _in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`rota ARGS` run in `directory`, with no ROTA_* in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    return subprocess.run(
        [sys.executable, "-m", "rota", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_with_no_url_set_the_error_names_rota_dev(tmp_path: Path) -> None:
    """Nothing set (no ROTA_*, no .env): the default was used, and the fix for
    a newcomer is `rota dev`; with the URLs in .env, they are what to check."""
    result = _in(tmp_path, "tenant", "alice")
    _one_line(result, "cannot reach PostgreSQL")
    assert "run `rota dev` in this directory" in result.stderr
    assert "postgresql://localhost/postgres, was used" in result.stderr
    (tmp_path / ".env").write_text(
        f"ROTA_DATABASE_URL=postgresql://rota@127.0.0.1:{_free_port()}/rota\n"
        f"ROTA_REDIS_URL=redis://127.0.0.1:{_free_port()}/0\n"
    )
    given = _in(tmp_path, "tenant", "alice")
    _one_line(given, "is PostgreSQL running, and is ROTA_DATABASE_URL right?")
    redis_down = _in(tmp_path, "dead-letters", "list")
    _one_line(redis_down, "is Redis running, and is ROTA_REDIS_URL right?")
