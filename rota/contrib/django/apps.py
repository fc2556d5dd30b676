"""The Django app: INSTALLED_APPS = [..., "rota.contrib.django"]."""

from __future__ import annotations

from django.apps import AppConfig


class RotaConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "rota.contrib.django"
    label = "rota"
    verbose_name = "rota"
    default = True
