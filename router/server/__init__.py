"""The router's HTTP server: app wiring, OpenAI dispatch, admin routes, metrics."""
