"""`rota dashboard` as an operator runs it on a network: over HTTPS with its
own certificate, tokens from a file, and no forwarded header believed from
a client that is not a trusted proxy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from rota.dashboard.auth import token_hash
from rota_tools.devservers import free_port, make_tls_files
from tests.helpers import start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent
OPS = "operator-token-0123456"


def test_the_console_over_https_with_a_tokens_file(database_url: str, tmp_path: Path) -> None:
    tls = make_tls_files()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops read,act {token_hash(OPS)}\n")
    port = free_port()
    console = start_logged(
        [
            sys.executable,
            "-m",
            "rota",
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--certfile",
            str(tls.cert),
            "--keyfile",
            str(tls.key),
        ],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "ROTA_DATABASE_URL": database_url,
            "ROTA_CONSOLE_TOKENS_FILE": str(tokens),
        },
    )
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=str(tls.ca)) as client:

            def up() -> bool:
                try:
                    return client.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, timeout=30, what="the console over HTTPS")
            assert client.get("/api/overview").status_code == 401
            ops = {"Authorization": f"Bearer {OPS}"}
            assert client.get("/api/overview", headers=ops).status_code == 200
            login = client.post("/login", data={"token": OPS}, follow_redirects=False)
            assert login.status_code == 303
            cookie = login.headers["set-cookie"].lower()
            assert "secure" in cookie and "httponly" in cookie and "max-age=43200" in cookie
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as plain:
            try:
                plain.get("/healthz")
            except httpx.HTTPError:
                pass  # only TLS is spoken
            else:
                raise AssertionError("the console answered plain HTTP")
    finally:
        console.stop(timeout=30)  # SIGTERM; killed if it has not stopped by then


@pytest.mark.parametrize("trusted", [False, True], ids=["untrusted", "trusted-proxy"])
def test_forwarded_headers_are_believed_only_from_a_trusted_proxy(
    database_url: str, trusted: bool
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ROTA_DATABASE_URL": database_url,
        "ROTA_DASHBOARD_TOKEN": OPS,
    }
    proxy = ["--trusted-proxy", "127.0.0.1"] if trusted else []
    console = start_logged(
        [sys.executable, "-m", "rota", "dashboard", "--port", str(port), *proxy], env=env
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:

            def up() -> bool:
                try:
                    return client.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, timeout=30, what="the console")
            # A client saying it is behind TLS: believed only from the proxy
            # named by --trusted-proxy (the session cookie is then Secure).
            said = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "10.9.9.9"}
            login = client.post("/login", data={"token": OPS}, headers=said, follow_redirects=False)
            assert login.status_code == 303
            assert ("secure" in login.headers["set-cookie"].lower()) is trusted
    finally:
        console.stop(timeout=30)  # SIGTERM; killed if it has not stopped by then
