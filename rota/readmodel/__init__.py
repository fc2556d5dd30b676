"""The read model: the figures, a task's story and the metrics, shared by the
CLI, the console and /metrics."""
