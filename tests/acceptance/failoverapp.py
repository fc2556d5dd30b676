"""The failover test's app: the acceptance tasks plus a cron task every
second, so that the maintenance leader's cron is seen to fire on the new
primary."""

from __future__ import annotations

import time

import rota
from tests.acceptance import workapp

app = rota.App.from_env()
app.tasks.update(workapp.app.tasks)

CRON_TENANT = "cron"


@app.periodic("* * * * * *", name="failover.tick", tenant=CRON_TENANT, queue="work")
def tick(at: str) -> None:
    workapp.log_run(time.time())
