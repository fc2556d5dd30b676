"""A cancelled task is logged as a cancel: at INFO, without a traceback;
a failure keeps its WARNING and traceback."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from rota.consumer.reports import Unreported
from rota.consumer.running import Outcome, sort_outcome
from rota.core import ClaimedTask
from rota.errors import Cancelled


def _task() -> ClaimedTask:
    now = datetime.now(UTC)
    return ClaimedTask(
        uuid4(), "reports.build", {"args": [], "kwargs": {}}, "q", "acme", 1, 3, now, now
    )


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_cancel_is_logged_at_info_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    task, unreported = _task(), Unreported()
    with caplog.at_level(logging.DEBUG, logger="rota"):
        sort_outcome(Outcome(task, _raised(Cancelled("was cancelled while it ran"))), unreported)
    [record] = [r for r in caplog.records if str(task.id) in r.getMessage()]
    assert record.levelno == logging.INFO
    assert "cancelled on attempt 1" in record.getMessage()
    assert "Traceback" not in record.getMessage() and record.exc_info is None
    [failure] = unreported.failed
    assert failure.task_id == task.id and failure.traceback is None


def test_a_failure_keeps_its_warning_and_traceback(caplog: pytest.LogCaptureFixture) -> None:
    task, unreported = _task(), Unreported()
    with caplog.at_level(logging.DEBUG, logger="rota"):
        sort_outcome(Outcome(task, _raised(ValueError("bad input"))), unreported)
    [record] = [r for r in caplog.records if str(task.id) in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "failed on attempt 1 of 3" in record.getMessage()
    assert "Traceback" in record.getMessage()
    assert unreported.failed[0].traceback is not None
