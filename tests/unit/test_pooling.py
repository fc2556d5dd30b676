"""What rota sends PostgreSQL behind a transaction pooler, without a server
(what each purpose's connection gets: tests/unit/test_connections.py)."""

from __future__ import annotations

from rota import Settings
from rota.runtime.links import link


def test_every_wait_on_the_network_is_bounded_unless_the_url_says_otherwise() -> None:
    assert link(20.0) == {
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 20000,
    }
    assert link(20.0, "postgresql://db/app?keepalives=0") == {}


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
