"""`--prefix-cache-isolation`: no measured run against a server is served from the prefix cache an earlier run
filled, while the prefixes one run shares inside itself still hit (the `prefix` workload measures that on purpose).

Repeats, the points of a sweep and a gate's runs send the same prompts (same seed) to the same server: with prefix
caching on (vLLM's default, and `cbbench serve`'s) every run after the first would find its prompts cached and
report a TTFT several times lower (vLLM issues 54227 and 52884). What a server offers, probed once before the first
run (`probe`), decides what each run does:
- a per-run `cache_salt` (vLLM's request field; `cbbench serve` takes it as vLLM does, mixed into the first KV
  block's hash): every request of a run carries the run's own salt, so its prompts match only each other; the
  warm-up carries another, so it warms no measured prompt either;
- a reset: POST /reset_prefix_cache (vLLM, with VLLM_SERVER_DEV_MODE=1, and `cbbench serve`) or POST /flush_cache
  (SGLang), sent after the warm-up, just before the measured run. A reset path that answers 404 or 405 is not
  offered.
`auto` (the default) uses whichever the server offers, both where it offers both; `salt` and `reset` insist on one
(a server that lacks it is refused before anything runs); `off` keeps today's behaviour for a user who wants a warm
cache. Where a server offers neither, each row says so (`prefix_cache_isolation` = "none") and a note under the
table says that runs after the first may be warm; the row's prefix-cache hit rate (the server's /metrics counters,
or the usage's cached_tokens) shows what happened either way. A server that accepts `cache_salt` but ignores it looks
salted here: its hit rate is the check.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from cbbench.perf.backends.http_client import HttpTarget, auth_headers, build_payload
from cbbench.perf.plan.options import PREFIX_CACHE_ISOLATION_MODES as MODES

RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")  # vLLM's (and cbbench serve's), then SGLang's
NOT_OFFERED = (404, 405)  # a reset path answering these is not there (vLLM without its development mode: 404)
PROBE_TIMEOUT_S = 60.0  # one tiny request and at most two resets; a server this slow fails its warm-up anyway
_BODY_CHARS = 200  # how much of a refusal's body a message quotes


@dataclass(frozen=True)
class Isolation:
    """What each measured run does so that it starts cold: its own `cache_salt`, a reset (the path), or neither."""

    mode: str  # what was asked (MODES)
    salt: bool = False
    reset_path: str | None = None

    @property
    def label(self) -> str:
        """The row's `prefix_cache_isolation`: salt, reset, salt+reset, none (nothing offered) or off (asked)."""
        if self.mode == "off":
            return "off"
        return "+".join(n for n, on in (("salt", self.salt), ("reset", self.reset_path is not None)) if on) or "none"

    @property
    def isolated(self) -> bool:
        return self.salt or self.reset_path is not None

    def note(self, base_url: str) -> str | None:
        """The line under the table where later runs may be warm; None where every run starts cold."""
        if self.mode == "off":
            return (
                "prefix-cache isolation off (--prefix-cache-isolation off): runs after the first may be served from "
                "the prefix cache earlier runs filled (see each row's prefix hit rate)"
            )
        if not self.isolated:
            return (
                f"the server at {base_url} offers neither cache_salt nor a prefix-cache reset "
                f"({' or '.join('POST ' + p for p in RESET_PATHS)}): runs after the first may be served from the "
                "prefix cache earlier runs filled (see each row's prefix hit rate)"
            )
        return None


def new_salt() -> str:
    """A salt no other run has: one per measured run (its warm-up gets another)."""
    return f"cbbench-{uuid.uuid4().hex}"


async def _reset_status(session: aiohttp.ClientSession, target: HttpTarget, path: str) -> tuple[int, str]:
    async with session.post(target.root + path, headers=auth_headers()) as resp:
        return resp.status, (await resp.text()).strip().replace("\n", " ")[:_BODY_CHARS]


async def reset(session: aiohttp.ClientSession, target: HttpTarget, path: str) -> str | None:
    """POST the reset; None once the server says it is done, else why not (a run that cannot start cold fails)."""
    try:
        status, body = await _reset_status(session, target, path)
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return f"POST {path} failed: {type(e).__name__}: {e}"
    if 200 <= status < 300:
        return None
    return f"the server did not reset its prefix cache before the run (POST {path}: HTTP {status}: {body})"


async def _salt_taken(session: aiohttp.ClientSession, target: HttpTarget) -> tuple[bool, str]:
    """Whether the server takes a request carrying `cache_salt` (one token of a tiny prompt, under a salt of its
    own so it caches nothing a run could hit): (taken, why not)."""
    prompt: Any = "hello" if target.prompt_format == "text" else [1, 2, 3, 4]
    payload = {**build_payload(target, prompt, 1), "cache_salt": new_salt()}
    try:
        async with session.post(target.url, json=payload, headers=auth_headers()) as resp:
            body = (await resp.text()).strip().replace("\n", " ")[:_BODY_CHARS]
            return resp.status == 200, f"HTTP {resp.status}: {body}"
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return False, f"{type(e).__name__}: {e}"


async def _probe(target: HttpTarget, mode: str, salt_possible: bool) -> Isolation:
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        salt, why = False, "not asked"
        if mode in ("auto", "salt") and salt_possible:
            salt, why = await _salt_taken(session, target)
        if mode == "salt" and not salt:
            raise ValueError(
                f"prefix_cache_isolation: salt, but the server at {target.base_url} refuses cache_salt ({why}); "
                "use --prefix-cache-isolation auto or reset"
            )
        reset_path, answers = None, []
        if mode in ("auto", "reset"):
            for path in RESET_PATHS:
                try:
                    status, body = await _reset_status(session, target, path)
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    answers.append(f"POST {path}: {type(e).__name__}")
                    continue
                if status not in NOT_OFFERED:  # offered; whether it resets now is each run's to see
                    reset_path = path
                    break
                answers.append(f"POST {path}: HTTP {status}")
        if mode == "reset" and reset_path is None:
            raise ValueError(
                f"prefix_cache_isolation: reset, but the server at {target.base_url} offers no prefix-cache reset "
                f"({'; '.join(answers)}); use --prefix-cache-isolation auto or salt"
            )
        return Isolation(mode, salt, reset_path)


def probe(target: HttpTarget, mode: str, *, salt_possible: bool = True) -> Isolation:
    """What the server offers, asked once before the first run (see the module docstring); ValueError naming the
    option when `mode` insists on what the server lacks. `salt_possible`: False for an endpoint whose requests
    carry no salt (embeddings)."""
    if mode not in MODES:
        raise ValueError(f"prefix_cache_isolation: expected one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return Isolation(mode)
    return asyncio.run(_probe(target, mode, salt_possible))
