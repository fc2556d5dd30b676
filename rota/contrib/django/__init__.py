"""rota in a Django project (Django >= 4.2, PostgreSQL through psycopg 3).

    # settings.py
    INSTALLED_APPS = [..., "rota.contrib.django"]
    ROTA = {"DATABASE_URL": "postgresql://...", "REDIS_URL": "redis://..."}
    # or ROTA_APP = "myproject.tasks:app", an app you made yourself

    # shop/tasks.py (found by `manage.py rota_worker`, like Celery's)
    from rota.contrib.django import app

    @app.task
    def send_receipt(order_id: int) -> None: ...

    # shop/views.py
    from rota.contrib.django import enqueue, enqueue_on_commit

    with transaction.atomic():
        order = Order.objects.create(...)
        receipt = send_receipt.using(tenant="acme").prepare(order.id)
        enqueue(receipt)             # in this transaction
        enqueue_on_commit(receipt)   # after it commits (one or the other)

`ROTA` holds rota.Settings' fields (any case: "REDIS_URL" or "redis_url");
what it leaves out comes from the ROTA_* environment variables as usual.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import psycopg
import pydantic
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from rota.app import App
from rota.contrib.connections import DifferentDatabase, check_same_database, server_cursors
from rota.settings import Settings
from rota.task import TaskCall

__all__ = [
    "DifferentDatabase",
    "connection",
    "enqueue",
    "enqueue_on_commit",
    "get_app",
    "rota_settings",
]

logger = logging.getLogger("rota.contrib.django")

_app: App | None = None
_app_lock = threading.Lock()


def rota_settings() -> Settings:
    """rota.Settings from the Django setting `ROTA` (a dict of Settings'
    fields), the ROTA_* environment variables filling in the rest."""
    options = getattr(django_settings, "ROTA", None) or {}
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured("settings.ROTA must be a dict of rota.Settings' fields")
    fields = {str(key).lower(): value for key, value in options.items()}
    unknown = sorted(str(key) for key in options if str(key).lower() not in Settings.model_fields)
    if unknown:
        raise ImproperlyConfigured(f"settings.ROTA has no such rota settings: {unknown}")
    try:
        return Settings(**fields)
    except pydantic.ValidationError as exc:
        raise ImproperlyConfigured(f"settings.ROTA: {exc}") from exc


def _load_app() -> App:
    path = getattr(django_settings, "ROTA_APP", None)
    if not path:
        return App(rota_settings())
    if getattr(django_settings, "ROTA", None):
        raise ImproperlyConfigured(
            "set settings.ROTA_APP or settings.ROTA, not both: the app named by "
            "ROTA_APP has its own settings"
        )
    module_name, _, attribute = str(path).partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ImproperlyConfigured(
            f"settings.ROTA_APP {path!r} must name a rota.App as package.module:app ({exc})"
        ) from exc
    if not isinstance(found, App):
        raise ImproperlyConfigured(f"settings.ROTA_APP {path!r} is a {type(found).__name__}")
    return found


def get_app() -> App:
    """The project's rota.App: the one settings.ROTA_APP names, else one made
    from settings.ROTA, once per process."""
    global _app
    with _app_lock:
        if _app is None:
            _app = _load_app()
        return _app


def __getattr__(name: str) -> App:
    # `from rota.contrib.django import app`, and `rota worker --app
    # rota.contrib.django:app`: made when first asked for, once settings exist.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def connection(using: str = DEFAULT_DB_ALIAS, app: App | None = None) -> psycopg.Connection[Any]:
    """The psycopg connection under Django's database `using`, opened if need
    be, after checking that it is the database rota's app uses."""
    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"rota enqueues in PostgreSQL transactions; database {using!r} is {wrapper.vendor}"
        )
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(
            f"database {using!r} runs on psycopg 2; rota needs Django's psycopg (3) "
            "backend: pip install 'psycopg[binary]' and Django uses it"
        )
    settings = (app or get_app()).settings
    check_same_database(raw.info, settings.database_url, f"Django's database {using!r}")
    return raw


def _app_of(call: TaskCall) -> App:
    """The app a run is enqueued through: its task's, or the project's
    (ROTA_APP) for a run made by name (`app.prepare`)."""
    if call.task is not None and isinstance(call.task.app, App):
        return call.task.app
    return get_app()


def enqueue(call: TaskCall, *, using: str = DEFAULT_DB_ALIAS) -> UUID:
    """Enqueues a run (`task.using(tenant=...).prepare(...)`) in the
    transaction of Django's database `using`: inside `transaction.atomic()`
    the task is stored if the block commits and gone if it rolls back;
    outside one, it is stored at once (autocommit)."""
    app = _app_of(call)
    calls = [call]
    raw = connection(using, app)
    try:
        with server_cursors(raw):
            return app.enqueue_many(calls, connection=raw)[0]
    except psycopg.Error:
        # The transaction is broken: Django must not go on as if it were not.
        if connections[using].in_atomic_block:
            transaction.set_rollback(True, using=using)
        raise


def enqueue_on_commit(
    call: TaskCall, *, using: str = DEFAULT_DB_ALIAS, robust: bool = False
) -> UUID:
    """Enqueues once the transaction of database `using` commits (Django's
    `transaction.on_commit`; at once outside `atomic()`), through the app's
    producer (Redis, or PostgreSQL when Redis is down); nothing if it rolls
    back. The task is checked now (bad arguments raise here) and its id,
    returned now, is the one it gets if the transaction commits.

    If the enqueue fails after the commit (Redis and PostgreSQL both down:
    rota.EnqueueError; a full tenant: rota.CapacityExceeded), the rows are
    committed and the task is not. By default the error is raised from the
    end of the atomic block (and Django runs none of that transaction's later
    on_commit callbacks); `robust=True` logs it to the "rota.contrib.django"
    logger and goes on."""
    app = _app_of(call)
    calls = [call]
    batch = app.batch(calls)
    task_id = batch.ids[0]

    def store() -> None:
        try:
            app.producer.store(batch)
        except Exception:
            if not robust:
                raise
            logger.exception(
                "task %s (%s, tenant %s) was not enqueued after the commit",
                task_id,
                calls[0].name,
                calls[0].tenant,
            )

    transaction.on_commit(store, using=using)
    return task_id
