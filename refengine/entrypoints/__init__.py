"""Serving refengine over HTTP: the OpenAI-compatible API server (`cbbench serve`), the async engine loop behind it,
the request/response models and the Prometheus metrics."""
