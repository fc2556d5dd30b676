"""rota.contrib.django against the real PostgreSQL and Redis, with
pytest-django: tasks in the request's transaction (committed with its rows,
gone with its rollback), after its commit (`enqueue_on_commit`), and
`manage.py rota_worker` running one.

Django is configured here, when the first test of this module asks for it,
not at collection: the rest of the suite runs as if pytest-django were not
installed (it neither reorders nor sets up anything while Django has no
settings). The project's database is cloned from rota's migrated template,
so rota's schema is in the database Django writes to."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from rota import App, EnqueueError, Settings, core
from rota.buffer.streams import all_streams
from rota.contrib.connections import DifferentDatabase
from rota.core import db
from rota.loader import Loader
from rota_tools.devservers import Server
from tests.helpers import start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent
DATABASE = "rota_django"  # the test database Django makes from rota's template

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def _url(server: Server, name: str) -> str:
    return server.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def rota_url(postgres_server: Server, template_url: str, redis_server: Server) -> str:
    """Configures Django (once) for tests/integration/django_project; the URL
    of the database it writes to, which is rota's too."""
    import django
    from django.conf import settings

    from tests.integration.django_project import settings as project

    url = _url(postgres_server, DATABASE)
    if not settings.configured:
        values = {name: getattr(project, name) for name in dir(project) if name.isupper()}
        values["DATABASES"] = {
            "default": project.database(
                _url(postgres_server, "postgres"),
                TEST={"NAME": DATABASE, "TEMPLATE": template_url.rsplit("/", 1)[1]},
            )
        }
        values["ROTA"] = {**project.ROTA, "DATABASE_URL": url, "REDIS_URL": redis_server.url}
        settings.configure(**values)
        django.setup()
    return url


@pytest.fixture(scope="session")
def django_db_blocker(rota_url: str, request: pytest.FixtureRequest) -> Any:
    """pytest-django's, once Django has settings (it is None before)."""
    from pytest_django.plugin import blocking_manager_key

    return request.config.stash[blocking_manager_key]


@pytest.fixture(scope="session")
def django_db_setup(rota_url: str) -> Iterator[None]:
    """pytest-django's, made to wait for the settings above."""
    from django.test.utils import setup_databases, teardown_databases

    config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    from rota.contrib.django import get_app

    get_app().close()
    teardown_databases(config, verbosity=0)


@pytest.fixture
def rota_settings(rota_url: str, redis_url: str) -> Settings:
    from rota.contrib.django import get_app

    return get_app().settings


def _states(url: str, ids: list[Any]) -> dict[Any, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(db.run(conn, core.task_states(ids)))


def _buffered(settings: Settings) -> int:
    with redis.Redis.from_url(settings.redis_url) as client:
        return sum(
            int(client.xlen(s)) for s in all_streams(settings.stream_prefix, settings.shards)
        )


def _load(settings: Settings) -> None:
    loader = Loader(settings)
    try:
        assert loader.drain().drained
    finally:
        loader.close()


def test_the_project_app_comes_from_settings_rota(rota_settings: Settings, rota_url: str) -> None:
    from rota.contrib.django import get_app
    from tests.integration.django_project.tasks import mark_paid

    assert rota_settings.database_url == rota_url
    assert rota_settings.shards == 4
    assert mark_paid.app is get_app()


def test_an_enqueue_in_atomic_commits_with_the_rows(rota_settings: Settings) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue, get_app
    from tests.integration.django_project.models import Order
    from tests.integration.django_project.tasks import mark_paid

    url = rota_settings.database_url
    with transaction.atomic():
        order = Order.objects.create(item="book")
        task_id = enqueue(mark_paid.using(tenant="shop").prepare(order.id))
        by_name = enqueue(get_app().prepare("mark_paid", [order.id], tenant="shop"))
        # Not there for anyone else until the request's transaction commits.
        assert _states(url, [task_id, by_name]) == {}
    assert set(_states(url, [task_id, by_name])) == {task_id, by_name}
    assert _buffered(rota_settings) == 0  # straight into PostgreSQL, with the rows
    # Outside atomic(), Django's autocommit: stored at once.
    alone = enqueue(mark_paid.using(tenant="shop").prepare(order.id))
    assert set(_states(url, [alone])) == {alone}


def test_a_rollback_leaves_no_task(rota_settings: Settings) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue
    from tests.integration.django_project.models import Order
    from tests.integration.django_project.tasks import mark_paid

    with pytest.raises(Boom), transaction.atomic():
        order = Order.objects.create(item="lamp")
        dropped = enqueue(mark_paid.using(tenant="shop").prepare(order.id))
        raise Boom
    with transaction.atomic():
        kept = enqueue(mark_paid.using(tenant="shop").prepare(1))
        with pytest.raises(Boom), transaction.atomic():  # a savepoint
            dropped_too = enqueue(mark_paid.using(tenant="shop").prepare(2))
            raise Boom
    assert not Order.objects.exists()
    assert set(_states(rota_settings.database_url, [dropped, kept, dropped_too])) == {kept}


def test_enqueue_on_commit_enqueues_only_after_the_commit(rota_settings: Settings) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue_on_commit
    from tests.integration.django_project.models import Order
    from tests.integration.django_project.tasks import mark_paid

    with transaction.atomic():
        order = Order.objects.create(item="pen")
        task_id = enqueue_on_commit(mark_paid.using(tenant="shop").prepare(order.id))
        assert _buffered(rota_settings) == 0
    assert _buffered(rota_settings) == 1  # through the buffer, as any enqueue
    with pytest.raises(Boom), transaction.atomic():
        Order.objects.create(item="ink")
        dropped = enqueue_on_commit(mark_paid.using(tenant="shop").prepare(order.id))
        raise Boom
    assert _buffered(rota_settings) == 1
    _load(rota_settings)
    assert set(_states(rota_settings.database_url, [task_id, dropped])) == {task_id}
    # Bad arguments fail in the request, not after its commit.
    with pytest.raises(ValueError), transaction.atomic():
        enqueue_on_commit(mark_paid.using(tenant="shop").prepare())


def test_a_failed_enqueue_after_the_commit_raises_or_is_logged(
    rota_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue_on_commit
    from tests.integration.django_project.models import Order

    # Neither server reachable: the rows commit, the task cannot be stored.
    nowhere = App(
        Settings(
            database_url="postgresql://127.0.0.1:1/none",
            redis_url="redis://127.0.0.1:1/0",
            redis_retries=0,
        )
    )

    @nowhere.task
    def notify(order_id: int) -> None: ...

    with pytest.raises(EnqueueError), transaction.atomic():
        Order.objects.create(item="cup")
        enqueue_on_commit(notify.using(tenant="shop").prepare(1))
    with caplog.at_level(logging.ERROR, logger="rota.contrib.django"), transaction.atomic():
        Order.objects.create(item="mug")
        task_id = enqueue_on_commit(notify.using(tenant="shop").prepare(2), robust=True)
    assert Order.objects.count() == 2
    assert str(task_id) in caplog.text
    nowhere.close()


def test_a_connection_to_another_database_is_refused(
    rota_settings: Settings, database_url: str
) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue

    elsewhere = App(Settings(database_url=database_url, redis_url=rota_settings.redis_url))

    @elsewhere.task
    def notify(order_id: int) -> None: ...

    with pytest.raises(DifferentDatabase, match="rota_django"), transaction.atomic():
        enqueue(notify.using(tenant="shop").prepare(1))
    assert _states(database_url, []) == {}
    elsewhere.close()


def test_manage_py_rota_worker_runs_the_projects_tasks(rota_settings: Settings) -> None:
    from django.db import transaction

    from rota.contrib.django import enqueue
    from tests.integration.django_project.models import Order
    from tests.integration.django_project.tasks import mark_paid

    with transaction.atomic():
        order = Order.objects.create(item="map")
        enqueue(mark_paid.using(tenant="shop").prepare(order.id))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tools")]),
        "ROTA_DATABASE_URL": rota_settings.database_url,
        "ROTA_REDIS_URL": rota_settings.redis_url,
    }
    with start_logged(
        [
            sys.executable,
            "-m",
            "django",
            "rota_worker",
            "--settings",
            "tests.integration.django_project.settings",
            "--concurrency",
            "1",
            "--no-maintenance",
        ],
        cwd=ROOT,
        env=env,
    ) as worker:
        wait_for(
            lambda: Order.objects.get(id=order.id).paid or worker.poll() is not None,
            what="the worker to run mark_paid",
        )
        assert worker.poll() is None, worker.errors()
        assert Order.objects.get(id=order.id).paid
        assert worker.stop(signal.SIGTERM, 30) == 0, worker.errors()


def test_settings_rota_is_checked(rota_settings: Settings) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from rota.contrib.django import rota_settings as from_django

    with override_settings(ROTA={"redis_url": "redis://elsewhere:6379/1", "Shards": 8}):
        made = from_django()
    assert (made.redis_url, made.shards) == ("redis://elsewhere:6379/1", 8)
    with override_settings(ROTA={"SHARDZ": 8}), pytest.raises(ImproperlyConfigured, match="SHARDZ"):
        from_django()
    with override_settings(ROTA={"SHARDS": 0}), pytest.raises(ImproperlyConfigured):
        from_django()
