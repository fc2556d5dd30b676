"""Found by `manage.py rota_worker` (every installed app's `tasks` module)."""

from __future__ import annotations

from rota.contrib.django import app
from tests.integration.django_project.models import Order


@app.task(queue="shop")
def mark_paid(order_id: int) -> int:
    return Order.objects.filter(id=order_id).update(paid=True)
