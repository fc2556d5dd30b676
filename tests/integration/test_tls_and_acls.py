"""TLS to both servers (a certificate authority made here), and a Redis ACL
user per component, against real servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from rota import App, Settings, core
from rota.core import db
from rota.core.migrate import migrate
from rota.loader import Loader
from rota_tools.devservers import (
    Server,
    TLSFiles,
    local_postgres,
    local_redis,
    make_tls_files,
    postgres_tls_settings,
)


@pytest.fixture(scope="module")
def tls() -> TLSFiles:
    return make_tls_files()


@pytest.fixture(scope="module")
def tls_postgres(tls: TLSFiles) -> Iterator[Server]:
    with local_postgres(settings=postgres_tls_settings(tls)) as server:
        yield server


@pytest.fixture(scope="module")
def tls_redis(tls: TLSFiles) -> Iterator[Server]:
    with local_redis(tls=tls) as server:
        yield server


def _pg_url(server: Server, ca: Path) -> str:
    return (
        f"postgresql://rota@localhost:{server.port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    )


def _redis_url(server: Server, ca: Path) -> str:
    return f"rediss://localhost:{server.port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"


def test_the_whole_path_over_verified_tls(
    tls: TLSFiles, tls_postgres: Server, tls_redis: Server
) -> None:
    settings = Settings(
        database_url=_pg_url(tls_postgres, tls.ca), redis_url=_redis_url(tls_redis, tls.ca)
    )
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        migrate(conn)
        assert conn.execute(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone() == (True,)
    app = App(settings)
    try:
        ids = app.enqueue_many([app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(20)])
    finally:
        app.close()
    assert app.producer.core.fallbacks == 0  # went through the TLS Redis
    loader = Loader(settings)
    try:
        assert loader.drain().loaded == 20
    finally:
        loader.close()
    with db.connect(settings.database_url) as conn:
        claimed = db.run(conn, core.claim(["q"], 100, "w"))
    assert sorted(t.id for t in claimed) == sorted(ids)


def test_a_server_the_ca_did_not_sign_is_refused(tls_postgres: Server, tls_redis: Server) -> None:
    other = make_tls_files()  # another CA
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(_pg_url(tls_postgres, other.ca))
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(_redis_url(tls_redis, other.ca)).ping()
    with pytest.raises(psycopg.OperationalError):  # the name must match too
        psycopg.connect(_pg_url(tls_postgres, other.ca).replace("localhost", "127.0.0.2"))


# The README's ACLs, one user per component (keys under the default prefix).
ACLS = {
    "producer": ["~rota:buffer:*", "+xadd", "+xlen", "+hincrbyfloat", "+hgetall", "+ping"],
    "loader": [
        "~rota:buffer:*",
        "+xgroup|create",
        "+xreadgroup",
        "+xautoclaim",
        "+xclaim",
        "+xpending",
        "+xack",
        "+xdel",
        "+xadd",
        "+xlen",
        "+xrange",
        "+xtrim",
        "+hkeys",
        "+hexists",
        "+hincrbyfloat",
        "+hdel",
        "(~rota:buffer:*:backlog +del)",  # a drained shard's backlog count only
        "+eval",
        "+ping",
    ],
}


@pytest.fixture
def acl_urls(redis_url: str) -> Iterator[dict[str, str]]:
    admin = redis.Redis.from_url(redis_url)
    address = redis_url.split("//", 1)[1]
    for user, rules in ACLS.items():
        admin.execute_command(
            "ACL", "SETUSER", f"rota_{user}", "reset", "on", f">{user}-pw", *rules
        )
    yield {user: f"redis://rota_{user}:{user}-pw@{address}" for user in ACLS}
    for user in ACLS:
        admin.acl_deluser(f"rota_{user}")


def test_each_component_works_with_its_redis_acl_and_is_refused_the_rest(
    acl_urls: dict[str, str], database_url: str, conn: psycopg.Connection[Any]
) -> None:
    db.transact(conn, core.configure_tenant("limited", capacity=100))
    producer = App(Settings(database_url=database_url, redis_url=acl_urls["producer"]))
    try:
        producer.enqueue_many([producer.prepare("x.y", queue="q", tenant="limited")] * 3)
        producer.enqueue("x.y", queue="q", tenant="free")
        assert producer.producer.core.fallbacks == 0  # all into the buffer
    finally:
        producer.close()
    loader = Loader(Settings(database_url=database_url, redis_url=acl_urls["loader"]))
    try:
        summary = loader.drain()
    finally:
        loader.close()
    assert summary.drained and summary.loaded == 4 and not summary.errors
    as_producer = redis.Redis.from_url(acl_urls["producer"])
    as_loader = redis.Redis.from_url(acl_urls["loader"])
    for client, command in (
        (
            as_producer,
            ("XREADGROUP", "GROUP", "rota-loader", "x", "STREAMS", "rota:buffer:{0}", ">"),
        ),
        (as_producer, ("XDEL", "rota:buffer:{0}", "0-1")),
        (as_producer, ("SET", "other:key", "1")),
        (as_producer, ("FLUSHALL",)),
        (as_loader, ("DEL", "rota:buffer:{0}")),
        (as_loader, ("GET", "session:1")),
        (as_loader, ("FLUSHALL",)),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
