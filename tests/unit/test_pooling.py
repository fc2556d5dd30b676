"""What rota sends PostgreSQL behind a transaction pooler, without a server."""

from __future__ import annotations

from rota import Settings
from rota.core import db


def test_a_pooled_connection_sends_no_startup_options_and_prepares_nothing() -> None:
    url = "postgresql://rota@pgbouncer:6432/app"
    assert db._options(url, synchronous_commit=True, pooled=True) == {"prepare_threshold": None}
    direct = db._options(url, synchronous_commit=False, pooled=False)
    assert "plan_cache_mode=force_generic_plan" in direct["options"]
    assert "synchronous_commit=off" in direct["options"]


def test_session_state_goes_to_the_direct_url_only_behind_a_pooler() -> None:
    plain = Settings(database_url="postgresql://db/app")
    assert (plain.transaction_pooling, plain.session_database_url) == (False, "postgresql://db/app")
    pooled = Settings(
        database_url="postgresql://rota:secret@pgbouncer/app",
        database_pooling="transaction",
        direct_database_url="postgresql://rota:secret@db/app",
    )
    assert pooled.session_database_url == "postgresql://rota:secret@db/app"
    assert "secret" not in repr(pooled)
    assert Settings(database_pooling="transaction").session_database_url is None
