"""The health server of a command's `--metrics-port`: /metrics (the
registry's series), /healthz (alive) and /readyz (connected and working)."""

from __future__ import annotations

import hmac
import ipaddress
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


class HealthServer:
    """Serves /metrics, /healthz and /readyz on a port, in a thread."""

    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], bool],
        registry: CollectorRegistry = REGISTRY,
        token: str | None = None,
    ) -> None:
        """With `token` (ROTA_METRICS_TOKEN), /metrics needs `Authorization:
        Bearer TOKEN`; the health checks never do."""
        server = self
        expected = f"Bearer {token}".encode() if token else None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    given = self.headers.get("Authorization", "").encode("utf-8", "replace")
                    if expected is not None and not hmac.compare_digest(given, expected):
                        self._send(401, b"a token is required\n")
                        return
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok\n")
                elif path == "/readyz":
                    ok = server.is_ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass  # scrapes every few seconds: not worth a log line each

        self.registry = registry
        self.ready = ready
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def is_ready(self) -> bool:
        try:
            return bool(self.ready())
        except Exception:
            return False

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_health(
    settings: Any,
    host: str,
    port: int,
    ready: Callable[[], bool],
    registry: CollectorRegistry = REGISTRY,
) -> HealthServer:
    """Starts the health server of a command's `--metrics-port`: beyond
    loopback only with ROTA_METRICS_TOKEN, which /metrics then requires."""
    from pydantic import SecretStr

    from rota.errors import ValidationError

    secret = settings.metrics_token
    token = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    if token is None and not is_loopback(host):
        raise ValidationError(
            f"--metrics-host {host} needs ROTA_METRICS_TOKEN (at least 16 characters): "
            "/metrics shows queue and tenant names"
        )
    server = HealthServer(host, port, ready, registry, token)
    server.start()
    return server


def is_loopback(host: str) -> bool:
    """Whether a host to listen on is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
