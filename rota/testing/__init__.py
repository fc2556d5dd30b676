"""Test your own tasks without Redis or PostgreSQL.

    from rota.testing import InMemory

    def test_signup_sends_mail() -> None:
        with InMemory(app) as queue:              # app's enqueues go to memory
            signup("alice@example.com")            # send_mail.using(...).enqueue(...)
            assert len(queue.waiting(task="send_mail", tenant="acme")) == 1
            results = queue.run_all()              # fair order, as a worker would
            assert results.succeeded == 1

Enqueues take the production path (`App.batch`'s checks, then the producer's
own flow, whose buffer entries are read back as a loader reads them), so
they raise the same errors. Tasks run with the worker's rules for their
outcome (`rota.consumer.running.sort_outcome`) and rota.fail's for retries
and death; see rota.testing.memory and rota.testing.line.
"""

from rota.testing.memory import InMemory
from rota.testing.records import Results, Run, TaskRecord

__all__ = ["InMemory", "Results", "Run", "TaskRecord"]
