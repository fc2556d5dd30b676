"""One way to reach Redis: every Redis client rota uses is built here.

`ROTA_REDIS_URL` names a single Redis or any node of a Redis Cluster; which
one it is is asked of the server once per URL (`INFO cluster`), so nothing
else needs setting. TLS (`rediss://`, `?ssl_ca_certs=...`), a user and a
password come from the URL. Timeouts are Redis's own (`ROTA_REDIS_TIMEOUT`),
never the database's.

On a cluster, every key rota writes carries its shard's hash tag
(`rota:buffer:{3}`, `rota:buffer:{3}:backlog`), so no command spans two
slots; redis-py's cluster clients send each command to the node that owns
its slot and follow MOVED and ASK redirects while slots move.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import AbstractBackoff
from redis.retry import Retry

from rota.runtime.links import keepalive
from rota.runtime.outage import LOOPS, Backoff
from rota.runtime.redact import redact_url
from rota.settings import Settings

Client: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"

_cluster_urls: dict[str, bool] = {}
_cluster_lock = threading.Lock()


class NotReplicated(redis.RedisError):
    """Fewer replicas than ROTA_REDIS_WAIT_REPLICAS confirmed a write in time."""


# A Redis server (or a cluster's master for a slot) out of reach for now, as
# against an error of the command itself: what a caller waits out and tries
# again. Lost, timed out, loading its data set (BusyLoadingError is a
# ConnectionError), a socket error redis-py let through (OSError); on a
# cluster, a slot with no master for now (a failover: CLUSTERDOWN, TRYAGAIN),
# redirects that did not settle (ClusterError), or no node reachable
# (RedisClusterException, SlotNotCoveredError among them).
SERVER_LOST: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)

# A Redis server that answers but takes no write for now: out of memory, a
# read-only replica, its master down, or (ROTA_REDIS_WAIT_REPLICAS) a write no
# replica confirmed in time.
WRITE_REFUSED: tuple[type[Exception], ...] = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    NotReplicated,
)


class PolicyBackoff(AbstractBackoff):
    """The waits between redis-py's own retries of a command that lost its
    connection (for callers with no retries of their own): the reconnect
    policy's (rota.runtime.outage)."""

    def __init__(self, backoff: Backoff = LOOPS) -> None:
        self.backoff = backoff

    def compute(self, failures: int) -> float:
        return self.backoff.delay(failures)


class RedisConfigError(redis.RedisError):
    """`ROTA_REDIS_URL` cannot work: the message says what to change."""


def _options(
    settings: Settings, timeout: float | None, retries: int | None
) -> tuple[dict[str, Any], int]:
    """The clients' options, and how often redis-py retries a command."""
    attempts = settings.redis_retries if retries is None else retries
    options: dict[str, Any] = {
        "socket_timeout": timeout or settings.redis_timeout,
        "socket_connect_timeout": settings.redis_timeout,
        "health_check_interval": 30,
        # Every command is bounded by its socket timeout; keepalives also end
        # an idle connection whose peer went silent (the same bound as
        # PostgreSQL's, ROTA_DATABASE_DEAD_LINK_SECONDS).
        "socket_keepalive": True,
        "socket_keepalive_options": _keepalive(settings.database_dead_link_seconds),
    }
    return options, attempts


def _keepalive(dead_link_seconds: float) -> dict[int, int]:
    bound = keepalive(dead_link_seconds)
    return {
        socket.TCP_KEEPIDLE: bound.idle,
        socket.TCP_KEEPINTVL: bound.interval,
        socket.TCP_KEEPCNT: bound.probes,
        socket.TCP_USER_TIMEOUT: bound.user_timeout_ms,
    }


def _known(url: str) -> bool | None:
    with _cluster_lock:
        return _cluster_urls.get(url)


def _remember(url: str, cluster: bool) -> bool:
    with _cluster_lock:
        _cluster_urls[url] = cluster
    return cluster


def _cluster_enabled(info: dict[str, Any]) -> bool:
    return int(info.get("cluster_enabled", 0)) == 1


def _answers_slots(ask: Callable[[], Any]) -> bool:
    """For a user refused INFO: a cluster client needs CLUSTER SLOTS, which a
    single Redis answers with an error (and refusing it, the user could not
    use a cluster anyway)."""
    try:
        ask()
    except redis.ResponseError:  # "cluster support disabled", or no permission
        return False
    return True


def is_cluster(settings: Settings) -> bool:
    """Whether `ROTA_REDIS_URL` names a node of a Redis Cluster (asked once per URL)."""
    known = _known(settings.redis_url)
    if known is not None:
        return known
    options, _ = _options(settings, None, 0)
    with redis.Redis.from_url(settings.redis_url, **options) as probe:
        try:
            cluster = _cluster_enabled(probe.info("cluster"))
        except redis.exceptions.NoPermissionError:
            cluster = _answers_slots(lambda: probe.execute_command("CLUSTER SLOTS"))
    return _remember(settings.redis_url, cluster)


async def ais_cluster(settings: Settings) -> bool:
    known = _known(settings.redis_url)
    if known is not None:
        return known
    options, _ = _options(settings, None, 0)
    probe = redis.asyncio.Redis.from_url(settings.redis_url, **options)
    try:
        try:
            cluster = _cluster_enabled(await probe.info("cluster"))
        except redis.exceptions.NoPermissionError:
            try:
                await probe.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
                cluster = True
            except redis.ResponseError:
                cluster = False
    finally:
        await probe.aclose()
    return _remember(settings.redis_url, cluster)


def connect(settings: Settings, timeout: float | None = None, retries: int | None = None) -> Client:
    """A client for `ROTA_REDIS_URL`: a `RedisCluster` on a cluster, else a `Redis`.

    `timeout` overrides the socket timeout (a loader's blocking reads need a
    longer one); `retries` is how often redis-py itself retries a command
    that lost its connection (0 for callers with their own policy)."""
    options, attempts = _options(settings, timeout, retries)
    retry = Retry(PolicyBackoff(), attempts)
    if is_cluster(settings):
        try:
            return redis.cluster.RedisCluster.from_url(settings.redis_url, retry=retry, **options)
        except redis.exceptions.RedisClusterException as exc:
            raise _config_error(settings, exc) from exc
    return redis.Redis.from_url(settings.redis_url, retry=retry, **options)


async def aconnect(
    settings: Settings, timeout: float | None = None, retries: int | None = None
) -> AsyncClient:
    """`connect` for asyncio."""
    options, attempts = _options(settings, timeout, retries)
    retry = AsyncRetry(PolicyBackoff(), attempts)
    if await ais_cluster(settings):
        try:
            return redis.asyncio.cluster.RedisCluster.from_url(
                settings.redis_url, retry=retry, **options
            )
        except redis.exceptions.RedisClusterException as exc:
            raise _config_error(settings, exc) from exc
    return redis.asyncio.Redis.from_url(settings.redis_url, retry=retry, **options)


def _config_error(settings: Settings, exc: Exception) -> RedisConfigError:
    return RedisConfigError(
        f"ROTA_REDIS_URL ({redact_url(settings.redis_url)}) names a Redis Cluster node, "
        f"but a cluster client cannot use it: {exc} (a cluster has only database 0)"
    )


def node_finder(client: Any) -> Callable[[str], Any] | None:
    """A cluster client's lookup of the node that owns a key's slot (None
    for a single Redis): for commands whose keys redis-py cannot place
    without asking the server. Sync and asyncio clients alike."""
    if is_cluster_client(client):
        find: Callable[[str], Any] = client.get_node_from_key
        return find
    return None


def node_of(client: Client, key: str) -> Any:
    """The cluster node that owns `key`'s slot (None for a single Redis)."""
    find = node_finder(client)
    return None if find is None else find(key)


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster)
