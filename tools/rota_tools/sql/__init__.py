"""The benchmarks', the demo's and the migration fixtures' SQL (named blocks, as in rota.sql)."""

from __future__ import annotations

from rota.sql import Blocks

BLOCKS = Blocks(__package__, ("bench.sql", "demo.sql", "fixtures.sql"))
query = BLOCKS.query
