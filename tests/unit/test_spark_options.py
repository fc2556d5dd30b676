"""The Spark commands' options and failures, without a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.cli.errors import EXPECTED, explain
from rota.loader.spark_session import conf_dir_defaults, log_file, parse_conf


def test_conf_pairs_are_parsed_and_a_malformed_one_is_named() -> None:
    assert parse_conf(["spark.driver.memory=4g", "a.b= x=y"]) == {
        "spark.driver.memory": "4g",
        "a.b": " x=y",
    }
    with pytest.raises(ValueError, match=r"'spark\.driver\.memory'"):
        parse_conf(["spark.driver.memory"])


def test_spark_conf_dir_defaults_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\nspark.ui.enabled   true\nspark.sql.session.timeZone=Europe/Paris\n\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert conf_dir_defaults() == {
        "spark.ui.enabled": "true",
        "spark.sql.session.timeZone": "Europe/Paris",
    }
    monkeypatch.delenv("SPARK_CONF_DIR")
    assert conf_dir_defaults() == {}


def _java_error(message: str) -> Exception:
    """An error as py4j raises it, without py4j."""
    error_type = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol"})
    return error_type(message)  # type: ignore[no-any-return]


def test_a_spark_out_of_memory_names_the_setting_in_one_line() -> None:
    error = _java_error(
        "An error occurred while calling o57.collectToPython.\n"
        ": java.lang.OutOfMemoryError: Java heap space\n\tat java.base/..."
    )
    line, code = explain(error)
    assert code == EXPECTED and "\n" not in line
    assert "java.lang.OutOfMemoryError: Java heap space" in line
    assert "spark.driver.memory" in line and str(log_file()) in line


def test_any_other_spark_failure_is_its_java_cause_in_one_line_without_passwords() -> None:
    error = _java_error(
        "An error occurred while calling o9.load.\n"
        ": org.postgresql.util.PSQLException: postgresql://rota:s3cret@db/x refused\n\tat x"
    )
    line, code = explain(error)
    assert code == EXPECTED and line.startswith("Spark failed: org.postgresql")
    assert "s3cret" not in line


def test_the_root_cause_is_the_one_shown() -> None:
    error = _java_error(
        "Error while instantiating 'SessionStateBuilder':\n\nJVM stacktrace:\n"
        "java.lang.IllegalArgumentException: Error while instantiating\n\tat a.b(c)\n"
        "Caused by: org.apache.spark.SparkIllegalArgumentException: The value 'lots' in the "
        'config "spark.sql.files.maxPartitionBytes" is invalid.\n\tat d.e(f)'
    )
    line, _ = explain(error)
    assert line.startswith("Spark failed: org.apache.spark.SparkIllegalArgumentException")
    assert "spark.sql.files.maxPartitionBytes" in line


class _Conf:
    """The part of a session's RuntimeConfig the loader uses."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    def __init__(self, **values: str) -> None:
        self.conf = _Conf(**values)


@pytest.mark.parametrize(
    ("checkpoint", "local"),
    [
        ("/var/lib/rota/loader", True),
        ("file:///var/lib/rota/loader", True),
        ("hdfs:///rota/loader", False),
        ("s3a://bucket/rota/loader", False),
    ],
)
def test_only_a_local_checkpoint_gets_the_filesystem_manager(checkpoint: str, local: bool) -> None:
    from rota.loader.spark import CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER, _checkpoint_manager

    session = _Session()
    _checkpoint_manager(session, checkpoint)  # type: ignore[arg-type]
    assert session.conf.get(CHECKPOINT_MANAGER) == (LOCAL_CHECKPOINT_MANAGER if local else None)


def test_a_checkpoint_manager_the_user_chose_is_kept() -> None:
    from rota.loader.spark import CHECKPOINT_MANAGER, _checkpoint_manager

    session = _Session(**{CHECKPOINT_MANAGER: "com.example.Manager"})
    _checkpoint_manager(session, "/var/lib/rota/loader")  # type: ignore[arg-type]
    assert session.conf.get(CHECKPOINT_MANAGER) == "com.example.Manager"
