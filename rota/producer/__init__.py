"""The producer SDK web apps import: tasks, enqueue, the buffer and its fallback."""

from rota.producer.app import App, Task, TaskCall
from rota.producer.producer import AsyncProducer, Producer

__all__ = ["App", "AsyncProducer", "Producer", "Task", "TaskCall"]
