"""The Quart app: the OpenAI-compatible /v1 routes, the management API (/api), health, auth and metrics."""
