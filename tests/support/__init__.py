"""Plain helper modules for tests (no fixtures): real processes, HTTP helpers."""
