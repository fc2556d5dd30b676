"""Replaying dead letters: their tasks loaded into PostgreSQL with the
loaders' own checks and function, by today's rules; what is still refused
stays in the dead-letter stream, with the new reason. And purging them.
Both are recorded in rota.audit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg

from rota import core
from rota.buffer.deadletters import DeadLetter, get
from rota.buffer.entries import parse_batch
from rota.buffer.redis_client import Client
from rota.buffer.streams import check_entry_id, dead_letter_stream
from rota.core import db
from rota.core.load import columns_of
from rota.errors import ValidationError
from rota.loader.store import load_in_chunks
from rota.model.envelope import TaskEnvelope, parse_envelope
from rota.settings import Settings


def _envelopes(letter: DeadLetter, settings: Settings) -> list[TaskEnvelope]:
    """The tasks a dead letter holds, checked by today's rules (raises
    ValidationError saying why they cannot be loaded)."""
    raw = letter.raw.encode()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"not JSON: {exc}") from None
    if isinstance(data, dict) and "templates" in data:
        batch, bad = parse_batch(raw, settings.max_payload_bytes)
        if bad:
            raise ValidationError(bad[0][1])
        envelopes = batch.envelopes()
    elif isinstance(data, dict) and "payload" in data:
        envelopes = [parse_envelope(data, settings.max_payload_bytes)]
    else:
        raise ValidationError("it holds no task (an unreadable entry)")
    allowed = settings.allowed_queues
    for envelope in envelopes:
        if allowed is not None and envelope.queue not in allowed:
            raise ValidationError(f"queue {envelope.queue!r} is not in ROTA_QUEUES")
    return envelopes


@dataclass
class Replayed:
    loaded: dict[str, int] = field(default_factory=dict)  # letter id: tasks stored
    refused: dict[str, str] = field(default_factory=dict)  # letter id: why it stays
    missing: list[str] = field(default_factory=list)


def replay(
    client: Client,
    conn: psycopg.Connection[Any],
    settings: Settings,
    letter_ids: Sequence[str],
    actor: str,
) -> Replayed:
    """Loads the tasks of dead letters into PostgreSQL, then deletes the
    letters that loaded; a task already stored is not stored twice."""
    result = Replayed()
    for letter_id in letter_ids:
        letter = get(client, settings.stream_prefix, letter_id)
        if letter is None:
            result.missing.append(letter_id)
            continue
        try:
            envelopes = _envelopes(letter, settings)
        except ValidationError as exc:
            result.refused[letter_id] = str(exc)
            continue
        stored, refused = load_in_chunks(conn, columns_of(envelopes), settings.loader_batch_size)
        if refused:
            result.refused[letter_id] = refused[0][1]
            continue
        result.loaded[letter_id] = stored
    if result.loaded:
        client.xdel(dead_letter_stream(settings.stream_prefix), *result.loaded)
        detail = {"letters": list(result.loaded)}
        db.run(conn, core.record(actor, "replay", "dead-letters", len(result.loaded), detail))
    return result


def purge(
    client: Client,
    conn: psycopg.Connection[Any],
    prefix: str,
    actor: str,
    letter_ids: Sequence[str] = (),
    everything: bool = False,
) -> int:
    """Deletes the dead letters named (or all of them); returns how many."""
    stream = dead_letter_stream(prefix)
    if everything:
        removed = int(client.xlen(stream))
        client.delete(stream)
    elif letter_ids:
        removed = int(client.xdel(stream, *[check_entry_id(i) for i in letter_ids]))
    else:
        return 0
    detail: dict[str, Any] = {"all": True} if everything else {"letters": list(letter_ids)}
    db.run(conn, core.record(actor, "purge", "dead-letters", removed, detail))
    return removed
