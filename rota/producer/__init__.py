"""The producer: checked tasks into the Redis buffer, or PostgreSQL when Redis
cannot take them. `rota.App` is the API web apps use; it makes these."""

from rota.producer.clients import AsyncProducer, Producer
from rota.producer.core import ProducerCore

__all__ = ["AsyncProducer", "Producer", "ProducerCore"]
