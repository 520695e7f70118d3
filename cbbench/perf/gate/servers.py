"""`cbbench gate --base-url A --head-url B`: the two servers are asked, before anything is measured, which models
they serve (`GET /v1/models`, the OpenAI API's list). A server that does not answer, or two servers that serve
different models, make the gate meaningless: ValueError, one line, exit 2."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence

MODELS_TIMEOUT_S = 10.0  # a server that takes longer to list its models is not ready to be measured


def served_models(url: str, option: str) -> list[str]:
    """The model ids `url` serves (ValueError naming `option` when it cannot say)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{option} {url!r}: expected http://HOST:PORT")
    req = urllib.request.Request(url.rstrip("/") + "/v1/models")
    key = os.environ.get("OPENAI_API_KEY")  # as the client of `perf --backend openai` sends it
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=MODELS_TIMEOUT_S) as res:
            doc = json.loads(res.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        raise ValueError(f"{option} {url}: GET /v1/models answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", None) or e
        raise ValueError(f"{option} {url}: no server answers ({why})") from None
    except ValueError:
        raise ValueError(f"{option} {url}: GET /v1/models did not answer JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"{option} {url}: GET /v1/models holds no model list")
    return sorted(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None)


def check_servers(base_url: str, head_url: str, model: str | None) -> str:
    """The model both servers serve and the gate measures: `model` when given (each must serve it), else the one
    model both serve. ValueError, one line, when a server is unreachable or the two serve different models."""
    base, head = served_models(base_url, "--base-url"), served_models(head_url, "--head-url")
    if model is not None:
        for url, served, option in ((base_url, base, "--base-url"), (head_url, head, "--head-url")):
            if model not in served:
                raise ValueError(f"{option} {url} does not serve --model {model} (it serves {_names(served)})")
        return model
    if base != head:
        raise ValueError(f"the servers serve different models: base {_names(base)}, head {_names(head)}")
    if len(base) != 1:
        raise ValueError(f"the servers serve {_names(base)}: name the one to measure with --model")
    return base[0]


def _names(models: Sequence[str]) -> str:
    return ", ".join(models) if models else "no model"
