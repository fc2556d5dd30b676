"""Operators' commands about tasks: `rota task`, `rota tasks`, `rota dead`
and `rota dead-letters`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import redis
import typer

from rota.buffer import redis_client
from rota.cli.app import DatabaseUrl, RedisUrl, app, run_admin, settings_from
from rota.cli.output import Actor, AsJson, actor_or_default, cell, emit, table
from rota.errors import ValidationError
from rota.model.rules import parse_duration
from rota.settings import Settings

task_app = typer.Typer(
    rich_markup_mode=None, help="One task: its story and why it waits; cancel; retry."
)
app.add_typer(task_app, name="task", no_args_is_help=True)
dead_app = typer.Typer(rich_markup_mode=None, help="Dead tasks.")
app.add_typer(dead_app, name="dead", no_args_is_help=True)
letters_app = typer.Typer(
    rich_markup_mode=None,
    help="The buffer's dead-letter stream (what loaders could not load).",
)
app.add_typer(letters_app, name="dead-letters", no_args_is_help=True)


def task_ids(values: list[str]) -> list[UUID]:
    ids = []
    for value in values:
        try:
            ids.append(UUID(value))
        except ValueError:
            raise ValidationError(f"{value!r} is not a task id (a UUID)") from None
    return ids


def since_time(value: str | None) -> datetime | None:
    """A time from an ISO date-time, or a duration ago ("2h", "7d")."""
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return datetime.now(UTC) - timedelta(seconds=parse_duration(value))
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def redis_or_none(settings: Settings) -> redis_client.Client | None:
    """A Redis client if Redis answers, else None (said on stderr): the
    commands print what PostgreSQL alone can tell."""
    client: redis_client.Client | None = None
    try:
        client = redis_client.connect(settings)
        client.ping()
    except (redis.RedisError, OSError) as exc:
        typer.echo(
            f"rota: Redis is unreachable ({type(exc).__name__}); without the buffer", err=True
        )
        if client is not None:
            client.close()
        return None
    return client


@contextlib.contextmanager
def connections(
    database_url: str | None, redis_url: str | None
) -> Iterator[tuple[Any, Any, Settings]]:
    from rota.core.connections import connect

    settings = settings_from(database_url, redis_url)
    client = redis_or_none(settings)
    try:
        with connect(settings, "admin") as conn:
            yield conn, client, settings
    finally:
        if client is not None:
            client.close()


def render_story(story: Any) -> str:
    lines = [f"task {story.id}: {story.where}", f"why: {story.why}"]
    task = story.task
    if task is not None:
        kept = task.status != "succeeded"  # a succeeded task's record keeps less
        allowed = "? (allowed: not kept)" if task.max_attempts is None else task.max_attempts
        cost = "not kept" if task.cost is None else f"{task.cost:g}"
        lines += [
            f"name {task.name or ('-' if kept else 'not kept')}  queue {task.queue}  "
            f"tenant {task.tenant}  attempts {task.attempts} of {allowed}  cost {cost}  "
            f"priority {task.priority if kept else 'not kept'}",
            f"enqueued {cell(task.enqueued_at)}  ended {cell(task.finished_at)}",
        ]
        if story.run is not None:
            run = story.run
            lines.append(f"claimed at {run.claimed_at}  started at {run.started_at}  ran {run.ran}")
        if task.ahead is not None:
            about = "about " if task.ahead_estimated else ""
            lines.append(f"place {about}{task.ahead:,} claimable task(s) ahead in fair order")
        if task.payload:
            lines.append(f"arguments {task.payload}")
        if task.traceback:
            lines += ["traceback:", task.traceback.rstrip()]
        lines += graph_lines(task.graph)
        for at, actor, action in task.history:
            lines.append(f"{cell(at)}  {action} by {actor}")
    if story.dead_letter is not None:
        lines.append(f"dead letter {story.dead_letter.id}: {story.dead_letter.raw[:500]}")
    return "\n".join(lines)


def graph_lines(graph: Any) -> list[str]:
    """A task's place in its workflow, for `rota task show`."""
    if graph is None:
        return []
    lines = []
    if graph.join_id is not None:
        lines.append(
            f"member of join {graph.join_id} ({graph.join_waiting} of its "
            f"{graph.join_members} member(s) yet to succeed)"
        )
    if graph.members is not None:
        failed = f"; dead of member {graph.failed_member}" if graph.failed_member else ""
        lines.append(f"join of {graph.members} member(s), {graph.waiting} yet to succeed{failed}:")
        lines += [f"  member {member}" for member in graph.member_ids]
    return lines


@task_app.command("show")
def task_show(
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """A task's story, wherever it is, and why it waits (exit 1 if not found)."""
    from rota.readmodel.story import task_story

    (found,) = task_ids([task_id])
    with connections(database_url, redis_url) as (conn, client, settings):
        story = task_story(conn, client, settings, found)
    emit(story, as_json, lambda: render_story(story))
    if story.where == "unknown":
        raise typer.Exit(1)


@task_app.command("cancel")
def task_cancel(
    ids: Annotated[list[str], typer.Argument(help="task ids")],
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Cancel tasks: waiting ones at once, running ones when their attempt
    ends (no retry). Exit 1 if an id is unknown."""
    from rota import core

    wanted = task_ids(ids)
    cancel = core.cancel(wanted, actor_or_default(actor))
    outcomes = run_admin(database_url, cancel)
    result = {str(i): outcomes.get(i, "unknown") for i in wanted}
    emit(result, as_json, lambda: table(["task", "outcome"], list(result.items())))
    if len(outcomes) < len(set(wanted)):
        raise typer.Exit(1)


@task_app.command("retry")
def task_retry(
    ids: Annotated[list[str], typer.Argument(help="task ids")],
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Run dead or cancelled tasks again: same ids, a fresh attempt budget.
    Exit 1 if one was not dead or cancelled."""
    from rota import core

    wanted = task_ids(ids)
    retry = core.retry(wanted, actor_or_default(actor))
    retried = run_admin(database_url, retry)
    result = {str(i): "retried" if i in retried else "not dead or cancelled" for i in wanted}
    emit(result, as_json, lambda: table(["task", "outcome"], list(result.items())))
    if len(retried) < len(set(wanted)):
        raise typer.Exit(1)


@app.command("tasks")
def tasks_list(
    state: Annotated[
        str,
        typer.Option(
            help="ready, running, claimed (not started: prefetched), scheduled, dead or cancelled"
        ),
    ],
    tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None,
    queue: Annotated[str | None, typer.Option(help="only this queue's")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Tasks in one state: ready in line order, running and claimed (not
    started: prefetched) by claim time, scheduled by run time, dead and
    cancelled the most recent first."""
    from rota.core import read

    listing = read.tasks(state, tenant=tenant, queue=queue, limit=limit)
    rows = run_admin(database_url, listing)
    emit(
        rows,
        as_json,
        lambda: table(
            ["id", "queue", "tenant", "task", "state", "attempts", "enqueued", "at", "last error"],
            [
                (
                    r.id,
                    r.queue,
                    r.tenant,
                    r.name,
                    r.state,
                    f"{r.attempts}/{r.max_attempts}",
                    r.enqueued_at,
                    r.at,
                    (r.last_error or "")[:60],
                )
                for r in rows
            ],
        ),
    )


@dead_app.command("retry")
def dead_retry(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None,
    queue: Annotated[str | None, typer.Option(help="only this queue's")] = None,
    since: Annotated[
        str | None, typer.Option(help="dead since: an ISO time, or a duration ago (2h, 7d)")
    ] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 100_000,
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Run dead tasks again, in bulk: same ids, a fresh attempt budget."""
    from rota import core

    retry = core.retry_dead(
        actor_or_default(actor), tenant=tenant, queue=queue, since=since_time(since), limit=limit
    )
    retried = run_admin(database_url, retry)
    emit({"retried": retried}, as_json, lambda: f"retried {retried:,} dead task(s)")


@letters_app.command("list")
def letters_list(
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    before: Annotated[str | None, typer.Option(help="older than this letter id")] = None,
    as_json: AsJson = False,
    redis_url: RedisUrl = None,
) -> None:
    """Dead letters, newest first, with their reasons."""
    from rota.buffer import deadletters

    settings = settings_from(redis_url=redis_url)
    client = redis_client.connect(settings)
    try:
        letters = deadletters.newest(client, settings.stream_prefix, limit, before)
        total = deadletters.count(client, settings.stream_prefix)
    finally:
        client.close()
    emit(
        {"total": total, "letters": letters},
        as_json,
        lambda: (
            f"{total:,} dead letter(s)\n"
            + table(
                ["id", "at", "tasks", "reason"],
                [(x.id, x.at, len(x.task_ids), x.reason[:80]) for x in letters],
            )
        ),
    )


@letters_app.command("show")
def letters_show(
    letter_id: Annotated[str, typer.Argument(help="the dead letter's id")],
    as_json: AsJson = False,
    redis_url: RedisUrl = None,
) -> None:
    """One dead letter, whole (exit 1 if there is none with this id)."""
    from rota.buffer import deadletters

    settings = settings_from(redis_url=redis_url)
    client = redis_client.connect(settings)
    try:
        letter = deadletters.get(client, settings.stream_prefix, letter_id)
    finally:
        client.close()
    if letter is None:
        typer.echo(f"rota: no dead letter {letter_id}", err=True)
        raise typer.Exit(1)
    emit(
        letter,
        as_json,
        lambda: (
            f"{letter.id} at {cell(letter.at)} from {letter.stream} {letter.entry}\n"
            f"reason: {letter.reason}\n{letter.raw}"
        ),
    )


@letters_app.command("replay")
def letters_replay(
    ids: Annotated[list[str], typer.Argument(help="dead letter ids")],
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Load dead letters' tasks into PostgreSQL with the loaders' checks;
    those still refused stay, with why. Exit 1 if any was not replayed."""
    from rota.core.connections import connect
    from rota.loader import replay

    settings = settings_from(database_url, redis_url)
    client = redis_client.connect(settings)
    try:
        with connect(settings, "admin") as conn:
            result = replay.replay(client, conn, settings, ids, actor_or_default(actor))
    finally:
        client.close()
    rows = [(i, f"loaded {n} task(s)") for i, n in result.loaded.items()]
    rows += [(i, f"still refused: {why}") for i, why in result.refused.items()]
    rows += [(i, "no such dead letter") for i in result.missing]
    emit(result, as_json, lambda: table(["letter", "outcome"], rows))
    if result.refused or result.missing:
        raise typer.Exit(1)


@letters_app.command("purge")
def letters_purge(
    ids: Annotated[list[str] | None, typer.Argument(help="dead letter ids")] = None,
    purge_all: Annotated[bool, typer.Option("--all", help="every dead letter")] = False,
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Delete dead letters (the ones named, or --all)."""
    from rota.core.connections import connect
    from rota.loader import replay

    if not ids and not purge_all:
        raise typer.BadParameter("name dead letter ids, or pass --all")
    settings = settings_from(database_url, redis_url)
    client = redis_client.connect(settings)
    try:
        with connect(settings, "admin") as conn:
            removed = replay.purge(
                client, conn, settings.stream_prefix, actor_or_default(actor), ids or [], purge_all
            )
    finally:
        client.close()
    emit({"purged": removed}, as_json, lambda: f"purged {removed:,} dead letter(s)")
