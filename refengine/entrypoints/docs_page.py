"""GET /docs: the API's routes and request fields as one self-contained HTML page, rendered from /openapi.json.

FastAPI's own /docs page loads Swagger UI's script and styles from a CDN, which an offline server (the usual case
for a benchmark box) cannot reach, so the page would stay blank; this one needs nothing but the server. vLLM users
expect /docs and /openapi.json to exist, so both stay on; `--disable-fastapi-docs` removes them as in vLLM.
"""

from __future__ import annotations

from html import escape
from typing import Any

_STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto}code{background:#eee;padding:0 .2em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
)


def _fields(schema: dict[str, Any], components: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(name, type, required) of a request body's schema, following one $ref."""
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        schema = components.get(ref.rsplit("/", 1)[1], {})
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema.get("properties", {}).items():
        kinds = [p.get("type") or p.get("$ref", "").rsplit("/", 1)[-1] for p in prop.get("anyOf", [prop])]
        out.append((name, " | ".join(k for k in kinds if k) or "any", name in required))
    return out


def render_docs(openapi: dict[str, Any]) -> str:
    components = openapi.get("components", {}).get("schemas", {})
    info = openapi.get("info", {})
    title = escape(info.get("title", "API"))
    head = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_STYLE}</style>"
        f"</head><body><h1>{title} {escape(str(info.get('version', '')))}</h1><p>The machine-readable schema "
        f"is at <a href='/openapi.json'>/openapi.json</a>.</p>"
    )
    parts = [head]
    for path, methods in openapi.get("paths", {}).items():
        for method, op in methods.items():
            parts.append(f"<h2><code>{escape(method.upper())} {escape(path)}</code></h2>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                rows = "".join(
                    f"<tr><td><code>{escape(n)}</code></td><td>{escape(t)}</td><td>{'yes' if r else ''}</td></tr>"
                    for n, t, r in _fields(body, components)
                )
                parts.append(f"<table><tr><th>field</th><th>type</th><th>required</th></tr>{rows}</table>")
    parts.append("</body></html>")
    return "".join(parts)
