from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    paid = models.BooleanField(default=False)
