"""Process plumbing: the reconnect policy, signals and process titles, logging, redaction."""
