"""rota: a fair, multi-tenant task queue for Python."""

from rota import core
from rota.app import App
from rota.context import Cancelled, OutsideTask, TaskContext, context
from rota.core import db
from rota.errors import (
    CapacityExceeded,
    EnqueueError,
    InvalidName,
    NotJSONSerializable,
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
    "core",
    "db",
    "group",
]
