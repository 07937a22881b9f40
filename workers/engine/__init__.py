"""Continuous-batching engine: scheduler, sequences, stop conditions, engine thread."""
