"""The consumer: workers, the reaper and scheduler (maintenance), cron."""

from rota.consumer.maintenance import Maintenance
from rota.consumer.worker import Worker

__all__ = ["Maintenance", "Worker"]
