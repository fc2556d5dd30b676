"""The process pool's children import the app: one that no module holds is
refused at start with the fix, not when the first task runs."""

from __future__ import annotations

import pytest

import rota
from rota.consumer import Worker
from rota.consumer.processes import spec_of
from tests.acceptance import workapp


def test_an_app_no_module_holds_is_refused_with_the_fix() -> None:
    app = rota.App(rota.Settings())

    @app.task
    def made_here() -> None: ...

    with pytest.raises(ValueError, match="define the app in an importable module"):
        Worker(app, pool="processes")


def test_the_app_is_found_in_its_tasks_module() -> None:
    assert spec_of(workapp.app) == "tests.acceptance.workapp:app"


def test_a_pool_other_than_threads_or_processes_is_refused() -> None:
    with pytest.raises(ValueError, match="threads or processes"):
        Worker(workapp.app, pool="greenlets")
