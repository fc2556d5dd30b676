"""rota: a fair, multi-tenant task queue for Python."""

from rota.errors import (
    CapacityExceeded,
    EnqueueError,
    InvalidName,
    LeaseLost,
    NotJSONSerializable,
    PayloadTooLarge,
    RotaError,
    UnknownTask,
    ValidationError,
)
from rota.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "CapacityExceeded",
    "EnqueueError",
    "InvalidName",
    "LeaseLost",
    "NotJSONSerializable",
    "PayloadTooLarge",
    "RotaError",
    "Settings",
    "UnknownTask",
    "ValidationError",
]
