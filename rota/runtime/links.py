"""The bounds of every wait on the network: keepalive probes and a user
timeout (`keepalive`), for PostgreSQL connections on the client's end
(libpq's parameters) and the server's (session settings), and for Redis
clients' sockets (rota.buffer.redis_client)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from psycopg.conninfo import conninfo_to_dict

from rota.model.rules import DEAD_LINK_SECONDS


def server_link(link_kwargs: Mapping[str, Any]) -> str:
    """The same dead-link bound on the server's side of the connection: a
    session whose client went silent ends within it, and with it the locks
    it held (a claim's row locks, the maintenance lock), instead of after the
    kernel's two hours."""
    if "tcp_user_timeout" not in link_kwargs or "keepalives_idle" not in link_kwargs:
        return ""
    return (
        f" -c tcp_keepalives_idle={link_kwargs['keepalives_idle']}"
        f" -c tcp_keepalives_interval={link_kwargs['keepalives_interval']}"
        f" -c tcp_keepalives_count={link_kwargs['keepalives_count']}"
        f" -c tcp_user_timeout={link_kwargs['tcp_user_timeout']}"
    )


_LINK_PARAMETERS = ("keepalives", "tcp_user_timeout")


class Keepalive(NamedTuple):
    """How a dead link is noticed within a bound: keepalive probes from a
    quarter of it on, three of them a quarter apart, and unacknowledged data
    given up after it. PostgreSQL's connections (`link`) and Redis's
    (rota.buffer.redis_client) use the same."""

    idle: int  # seconds
    interval: int  # seconds
    probes: int
    user_timeout_ms: int


def keepalive(dead_link_seconds: float) -> Keepalive:
    quarter = max(1, int(dead_link_seconds / 4))
    return Keepalive(quarter, quarter, 3, int(dead_link_seconds * 1000))


def link(dead_link_seconds: float = DEAD_LINK_SECONDS, url: str = "") -> dict[str, Any]:
    """libpq's parameters that bound every wait on the network (`keepalive`).
    Left to the URL if it names any of them."""
    if url and any(name in conninfo_to_dict(url) for name in _LINK_PARAMETERS):
        return {}
    bound = keepalive(dead_link_seconds)
    return {
        "keepalives": 1,
        "keepalives_idle": bound.idle,
        "keepalives_interval": bound.interval,
        "keepalives_count": bound.probes,
        "tcp_user_timeout": bound.user_timeout_ms,
    }
