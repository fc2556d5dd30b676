"""The CLI's one place for errors (rota.cli.errors): a module of an extra
names the extra to install; a server a command reads around is named with
the fix rota knows; a URL in .env counts as set."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.cli.errors import EXPECTED, UNEXPECTED, explain, unavailable


def test_a_missing_module_of_an_extra_names_the_extra() -> None:
    line, code = explain(ModuleNotFoundError("No module named 'pyspark'", name="pyspark"))
    assert code == EXPECTED and "pip install 'rota[spark]'" in line
    line, code = explain(ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn"))
    assert code == EXPECTED and "pip install 'rota[dashboard]'" in line
    line, code = explain(ModuleNotFoundError("No module named 'nope'", name="nope"))
    assert code == UNEXPECTED and "pip install" not in line


def test_a_server_read_around_is_named_with_its_fix() -> None:
    said = 'OperationalError: server error: unsupported startup parameter: "options"'
    line = unavailable("postgresql", said)
    assert line.startswith(f"postgresql unavailable: {said}; ")
    assert "ROTA_DATABASE_POOLING=transaction" in line
    assert unavailable("redis", "ConnectionError: refused") == (
        "redis unavailable: ConnectionError: refused"
    )


def test_a_url_in_dotenv_counts_as_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROTA_DATABASE_URL", raising=False)
    refused = psycopg.OperationalError("connection refused")
    assert "rota dev" in explain(refused)[0]
    (tmp_path / ".env").write_text("ROTA_DATABASE_URL=postgresql://rota@127.0.0.1:1/rota\n")
    assert "is ROTA_DATABASE_URL right?" in explain(refused)[0]
