"""The Spark session rota's jobs run in (`rota loader run --engine spark`,
`rota import`), built from the user's Spark configuration and rota's few
defaults.

Precedence, lowest first: rota's defaults, `$SPARK_CONF_DIR/spark-defaults.conf`
(which Spark reads itself; rota's defaults give way to it), then `--conf
key=value`. Spark's and the JVM's own output goes to a log file unless a
`--spark-log-level` asks for it in the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("rota.spark")

# Defaults a user's configuration overrides.
DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Timestamps without a zone (TIMESTAMP_NTZ) are read as UTC.
    "spark.sql.session.timeZone": "UTC",
    # Progress bars garble a service's log (and the demo's tables).
    "spark.ui.showConsoleProgress": "false",
}
LOG_LEVELS = ("all", "debug", "info", "warn", "error", "fatal", "off")


@dataclass(frozen=True)
class SparkOptions:
    """What the Spark commands take: `--conf`, `--spark-ui`, `--spark-log-level`."""

    conf: Mapping[str, str] = field(default_factory=dict)
    ui: bool = False
    log_level: str | None = None  # None: Spark's own output goes to `log_file()`


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """`--conf key=value` pairs; raises ValueError naming a malformed one."""
    conf: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf takes key=value, got {pair!r}")
        conf[key.strip()] = value
    return conf


def conf_dir_defaults() -> dict[str, str]:
    """`$SPARK_CONF_DIR/spark-defaults.conf` ("key value" lines), if any."""
    directory = os.environ.get("SPARK_CONF_DIR")
    path = Path(directory) / "spark-defaults.conf" if directory else None
    if path is None or not path.is_file():
        return {}
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.replace("=", " ", 1).partition(" ")
            found[key.strip()] = value.strip()
    return found


def log_file() -> Path:
    """Where Spark's and the JVM's output goes unless shown (one per process)."""
    return Path(tempfile.gettempdir()) / f"rota-spark-{os.getpid()}.log"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """The JVM inherits the process's stderr when it starts: pointing fd 2 at
    a file for that moment sends all its later output there too."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as target:
        os.dup2(target.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def spark_session(
    master: str = "local[*]", app_name: str = "rota-loader", options: SparkOptions | None = None
) -> Any:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    options = options or SparkOptions()
    if options.log_level is not None and options.log_level.lower() not in LOG_LEVELS:
        raise ValueError(f"--spark-log-level must be one of {', '.join(LOG_LEVELS)}")
    # Executors must run this interpreter (it has rota and its dependencies).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no network needed
    user = conf_dir_defaults()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in DEFAULTS.items():
        if key not in user:
            builder = builder.config(key, value)
    if "spark.ui.enabled" not in user or options.ui:
        builder = builder.config("spark.ui.enabled", "true" if options.ui else "false")
    for key, value in options.conf.items():
        builder = builder.config(key, value)
    starting = SparkContext._active_spark_context is None
    quiet = options.log_level is None
    if starting and quiet:
        with _stderr_to(log_file()):
            session = builder.getOrCreate()
        log.info("Spark's own log: %s (--spark-log-level to see it here)", log_file())
    else:
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel((options.log_level or "warn").upper())
    jvm: Any = session._jvm
    # A loader with a backlog runs batches back to back, longer than the
    # trigger interval, by design: Spark would warn about it on every batch.
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
        jvm.org.apache.logging.log4j.Level.ERROR,
    )
    if options.ui:
        log.info("Spark UI: %s", session.sparkContext.uiWebUrl)
    return session
