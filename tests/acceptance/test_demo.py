"""`rota demo` with no URL set runs on the embedded servers (nothing of the
machine's server packages), here on the Python loader (the loader of a
machine without Java), down to each tenant group's waits and the chart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.docs_examples import ROOT


@pytest.mark.slow(reason="the demo's whole pipeline: servers, loader, two worker processes")
def test_the_demo_runs_on_the_embedded_servers_without_a_url(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tools")])
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rota", "demo", "--flood", "400", "--small-tenants", "3"),
            *("--loader", "python", "--out", str(tmp_path / "out"), "--json"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "starting the embedded servers" in done.stdout
    result = json.loads(done.stdout[done.stdout.rindex("\n{") :])
    assert result["groups"]["flood"]["tasks"] == 400
    assert {"steady", "small"} <= set(result["groups"])
    assert Path(result["chart"]).exists()
    assert not list(Path(tempfile.gettempdir()).glob("rota-demo-*/postgres/postmaster.pid"))
