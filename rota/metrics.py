"""Metrics in the Prometheus text format (`rota stats --format prometheus`), for a
node-exporter textfile collector or any scraper that reads the format."""

from __future__ import annotations

from collections.abc import Mapping


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def prometheus_text(
    buffer: Mapping[str, Mapping[str, float | int]],
    queues: Mapping[str, Mapping[str, int]],
) -> str:
    lines = [
        "# HELP rota_buffer_entries Entries in a buffer shard not yet loaded.",
        "# TYPE rota_buffer_entries gauge",
        *(f"rota_buffer_entries{_labels(shard=s)} {v['entries']}" for s, v in buffer.items()),
        "# HELP rota_buffer_pending Entries read by a loader but not yet acknowledged.",
        "# TYPE rota_buffer_pending gauge",
        *(f"rota_buffer_pending{_labels(shard=s)} {v['pending']}" for s, v in buffer.items()),
        "# HELP rota_buffer_oldest_age_seconds Age of the oldest entry not yet loaded.",
        "# TYPE rota_buffer_oldest_age_seconds gauge",
        *(
            f"rota_buffer_oldest_age_seconds{_labels(shard=s)} {v['oldest_age_seconds']}"
            for s, v in buffer.items()
        ),
        "# HELP rota_queue_tasks Tasks in PostgreSQL by queue and state.",
        "# TYPE rota_queue_tasks gauge",
        *(
            f"rota_queue_tasks{_labels(queue=q, state=state)} {n}"
            for q, counts in queues.items()
            for state, n in counts.items()
        ),
    ]
    return "\n".join(lines) + "\n"
