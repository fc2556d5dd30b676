"""The benchmarks' and the demo's own SQL (named blocks, as in rota.sql)."""

from __future__ import annotations

from rota.sql import Blocks

BLOCKS = Blocks(__package__, ("bench.sql", "demo.sql"))
query = BLOCKS.query
