"""What rota sends PostgreSQL behind a transaction pooler, without a server."""

from __future__ import annotations

from rota import Settings
from rota.core import db


def test_a_pooled_connection_sends_no_startup_options_and_prepares_nothing() -> None:
    url = "postgresql://rota@pgbouncer:6432/app"
    link = db.link(20.0)
    assert db._options(url, synchronous_commit=True, pooled=True, link_kwargs=link) == {
        "prepare_threshold": None
    }
    direct = db._options(url, synchronous_commit=False, pooled=False, link_kwargs=link)
    assert "plan_cache_mode=force_generic_plan" in direct["options"]
    assert "synchronous_commit=off" in direct["options"]
    # The dead-link bound is asked of the server's end too.
    assert "-c tcp_keepalives_idle=5" in direct["options"]
    assert "-c tcp_user_timeout=20000" in direct["options"]


def test_every_wait_on_the_network_is_bounded_unless_the_url_says_otherwise() -> None:
    assert db.link(20.0) == {
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 20000,
    }
    assert db.link(20.0, "postgresql://db/app?keepalives=0") == {}
    reach = db.reach(Settings(database_dead_link_seconds=8, database_timeout_seconds=3))
    assert (reach["connect_timeout"], reach["keepalives_idle"], reach["tcp_user_timeout"]) == (
        3,
        2,
        8000,
    )


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
