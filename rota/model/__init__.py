"""The task model and its validation: envelopes, names and limits, JSON values."""
