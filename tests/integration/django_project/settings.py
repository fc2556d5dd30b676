"""Settings for the worker subprocess (`python -m django rota_worker
--settings tests.integration.django_project.settings`): the database is the
one ROTA_DATABASE_URL names, Redis comes from ROTA_REDIS_URL."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit


def database(url: str, **extra: Any) -> dict[str, Any]:
    """Django's DATABASES entry for a postgresql:// URL."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "HOST": parts.hostname or "",
        "PORT": parts.port or "",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        **extra,
    }


SECRET_KEY = "rota-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["rota.contrib.django", "tests.integration.django_project"]
DATABASES = {"default": database(os.environ.get("ROTA_DATABASE_URL", "postgresql:///postgres"))}
ROTA = {"SHARDS": 4, "CAPACITY_CACHE_SECONDS": 0, "POLL_SECONDS": 0.2}
