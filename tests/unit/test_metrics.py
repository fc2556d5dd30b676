from rota.metrics import prometheus_text


def test_prometheus_text_has_a_series_per_shard_and_queue_state() -> None:
    text = prometheus_text(
        {"rota:buffer:{0}": {"entries": 3, "pending": 1, "oldest_age_seconds": 2.5}},
        {"pdfs": {"ready": 7, "running": 2, "scheduled": 0}},
    )
    assert 'rota_buffer_entries{shard="rota:buffer:{0}"} 3' in text
    assert 'rota_buffer_oldest_age_seconds{shard="rota:buffer:{0}"} 2.5' in text
    assert 'rota_queue_tasks{queue="pdfs",state="ready"} 7' in text
    assert text.count("# TYPE") == 4 and text.endswith("\n")


def test_label_values_are_escaped() -> None:
    text = prometheus_text({'a"b\\c': {"entries": 0, "pending": 0, "oldest_age_seconds": 0}}, {})
    assert 'shard="a\\"b\\\\c"' in text
