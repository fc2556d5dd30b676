"""The loader: drains the Redis buffer into PostgreSQL (Python engine, Lambda
handler, long-running loop, and the Spark pipeline in rota.loader.spark)."""

from rota.loader.engine import DrainSummary, Loader
from rota.loader.handler import lambda_handler

__all__ = ["DrainSummary", "Loader", "lambda_handler"]
