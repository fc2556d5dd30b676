"""`rota dev` writes its two URLs to .env, keeping the file's other lines,
replacing what it wrote before, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.cli.dev import write_env
from rota.settings import Settings

URLS = {
    "ROTA_DATABASE_URL": "postgresql://rota@127.0.0.1:5555/postgres",
    "ROTA_REDIS_URL": "redis://127.0.0.1:6666/0",
}


def test_the_urls_replace_their_old_lines_and_the_rest_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*URLS, "ROTA_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    env = tmp_path / ".env"
    env.write_text("# mine\nROTA_SHARDS=8\nexport ROTA_DATABASE_URL=postgresql://old/db\n")
    write_env(env, URLS)
    write_env(env, {**URLS, "ROTA_REDIS_URL": "redis://127.0.0.1:7777/0"})
    lines = env.read_text().splitlines()
    assert lines[:2] == ["# mine", "ROTA_SHARDS=8"]
    assert [line for line in lines if "DATABASE_URL" in line] == [
        "ROTA_DATABASE_URL=postgresql://rota@127.0.0.1:5555/postgres"
    ]
    assert [line for line in lines if "REDIS_URL" in line] == [
        "ROTA_REDIS_URL=redis://127.0.0.1:7777/0"
    ]
    assert sum(line.startswith("# rota dev") for line in lines) == 1
    # What rota reads in that directory.
    read = Settings(_env_file=env)  # type: ignore[call-arg]
    assert read.database_url == URLS["ROTA_DATABASE_URL"] and read.shards == 8
