"""The consumer: workers, and the maintenance duties (due tasks, leases, dead
workers, cron, retention) run by one of them or by `rota maintenance`."""

from rota.consumer.maintenance import Maintenance
from rota.consumer.worker import Worker

__all__ = ["Maintenance", "Worker"]
