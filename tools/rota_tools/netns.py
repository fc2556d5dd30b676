"""Test hosts in network namespaces, whose links to the servers a test fails
on purpose (the network-fault suite, `rota bench chaos --network`).

Each server gets an address of its own on a dummy interface of this machine
(`serve`, on a bridge without ports); each process runs in a namespace of its own (`host`), which
reaches each server through a veth pair of its own. Setting a pair's host
end down partitions that process from that server silently: packets are
dropped both ways, nothing is reset, the process is not told, as when a
switch or a security group drops traffic. Setting it up again heals the
link; TCP connections that outlived the partition carry on. The kernel here
has no netem: a bandwidth cap is tc tbf on a link, added latency a proxy of
the test's own (rota_tools.delay_proxy).

Root only (`ip netns`, `ip link`); everything is removed on `close`.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# One /16 per network, numbered by the process that made it: 10.(100+n).x.y.
_NETWORKS = itertools.count()


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    subprocess.run(command, check=True, capture_output=True)


@dataclass
class Link:
    """One process's way to one server: a veth pair, its host end named here."""

    host_end: str


@dataclass
class Host:
    """A network namespace for one process, with a link to each server."""

    name: str
    namespace: str
    links: dict[str, Link] = field(default_factory=dict)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class TestNetwork:
    """Servers' addresses and processes' hosts, made and removed by a test."""

    def __init__(self) -> None:
        number = next(_NETWORKS)
        # Names are short (15 characters for an interface) and unique per
        # process, so that parallel test workers do not collide.
        self.tag = f"r{os.getpid() % 100000}{number}"
        self.prefix = f"10.{100 + (os.getpid() + number) % 100}"
        self.dummy = f"{self.tag}d"
        self.servers: dict[str, str] = {}
        self.hosts: dict[str, Host] = {}
        self._pairs = 0
        # A bridge with no ports holds the addresses (this kernel has no dummy).
        _ip("link", "add", self.dummy, "type", "bridge")
        _ip("link", "set", self.dummy, "up")

    def serve(self, name: str) -> str:
        """The address server `name` is to listen on (made now)."""
        address = f"{self.prefix}.0.{len(self.servers) + 1}"
        _ip("addr", "add", f"{address}/32", "dev", self.dummy)
        self.servers[name] = address
        return address

    def host(self, name: str) -> Host:
        """A namespace for process `name`, linked to every server served so far."""
        namespace = f"{self.tag}-{name}"
        _ip("netns", "add", namespace)
        _ip("link", "set", "lo", "up", namespace=namespace)
        host = Host(name, namespace)
        for server, address in self.servers.items():
            self._pairs += 1
            pair = self._pairs
            host_end, inner_end = f"{self.tag}h{pair}", f"{self.tag}n{pair}"
            near, far = f"{self.prefix}.{pair}.1", f"{self.prefix}.{pair}.2"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
            _ip("link", "set", inner_end, "netns", namespace)
            _ip("addr", "add", f"{near}/30", "dev", host_end)
            _ip("link", "set", host_end, "up")
            _ip("addr", "add", f"{far}/30", "dev", inner_end, namespace=namespace)
            _ip("link", "set", inner_end, "up", namespace=namespace)
            _ip("route", "add", f"{address}/32", "via", near, namespace=namespace)
            host.links[server] = Link(host_end)
        self.hosts[name] = host
        return host

    def partition(self, host: Host, server: str) -> None:
        """Drops every packet between `host` and `server`, silently."""
        _ip("link", "set", host.links[server].host_end, "down")

    def heal(self, host: Host, server: str) -> None:
        _ip("link", "set", host.links[server].host_end, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            for link in host.links.values():
                subprocess.run(["ip", "link", "del", link.host_end], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.dummy], capture_output=True)

    def __enter__(self) -> TestNetwork:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def available() -> bool:
    """Whether this machine lets the tests make namespaces (root, iproute2)."""
    if os.geteuid() != 0:
        return False
    probe = f"rprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True
