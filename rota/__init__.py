"""rota: a fair, multi-tenant task queue for Python.

The public API, each name documented in docs/reference/python-api.md. The
packages below (rota.core, rota.buffer, rota.producer, ...) stay importable
for rota's own adapters and for the curious, without promises."""

from rota.app import App
from rota.context import TaskContext, context
from rota.errors import (
    Cancelled,
    CapacityExceeded,
    EnqueueError,
    InvalidName,
    NotJSONSerializable,
    OutsideTask,
    PayloadTooLarge,
    ResultError,
    ResultExpired,
    ResultNotKept,
    Retry,
    RotaError,
    SoftTimeLimitExceeded,
    TaskCancelled,
    TaskFailed,
    UnknownTask,
    ValidationError,
)
from rota.model.limits import Limit
from rota.settings import Settings
from rota.task import Enqueue, Task, TaskCall
from rota.workflow import Workflow, after, chain, group

__version__ = "0.1.0"

__all__ = [
    "App",
    "Cancelled",
    "CapacityExceeded",
    "Enqueue",
    "EnqueueError",
    "InvalidName",
    "Limit",
    "NotJSONSerializable",
    "OutsideTask",
    "PayloadTooLarge",
    "ResultError",
    "ResultExpired",
    "ResultNotKept",
    "Retry",
    "RotaError",
    "Settings",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskCall",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "UnknownTask",
    "ValidationError",
    "Workflow",
    "after",
    "chain",
    "context",
    "group",
]
