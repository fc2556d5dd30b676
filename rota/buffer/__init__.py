"""The Redis buffer: stream entries, the sharded streams, the Redis clients and the dead letters."""
