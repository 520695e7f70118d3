"""The "server" backends: "openai" (/v1/completions) and "openai-chat", an OpenAI-compatible server at --base-url.

Each is registered with its arguments, `HttpArgs`: how the client talks to the server (`--prompt-format`,
`--ignore-eos`, `--request-timeout`, `--client-workers`, `--prefix-cache-isolation`); the server's address is the
plan's (`RunSettings.base_url`). Before the first run the backend asks the server what it offers to keep each run
from the prefixes an earlier one cached (`prepare`, cache_isolation.py).
One measured run (warm-up, /metrics scraped around the replay) is http_run.py's; it returns the same `RunResult` the
in-process runner does, so the metrics, the CSV row and the table are the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from cbbench.perf.backends.backend import Backend, BackendArgs, ProgressFn, RunResult
from cbbench.perf.backends.cache_isolation import Isolation, probe
from cbbench.perf.backends.client_workers import check_client_workers
from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.knobs import KnobGrid, knob_names
from cbbench.perf.records import RequestRecord

if TYPE_CHECKING:
    from cbbench.perf.plan.options import BackendOptions
    from cbbench.perf.plan.spec import RunSettings, RunSpec


@dataclass(frozen=True)
class HttpArgs(BackendArgs):
    """What an HTTP backend takes of the command line: the prompts as token ids or text, vLLM's ignore_eos field,
    the seconds one request may take, the client processes the requests are sharded over (checked, with the
    server's address, when the backend is made), and how each run is kept from an earlier run's cached prefixes."""

    prompt_format: str = "ids"
    ignore_eos: bool = True
    request_timeout: float = 6 * 3600
    client_workers: int = 1
    prefix_cache_isolation: str = "auto"

    @classmethod
    def of(cls, options: BackendOptions) -> HttpArgs:
        c = options.client
        return cls(c.prompt_format, c.ignore_eos, c.request_timeout, c.client_workers, c.prefix_cache_isolation)


def http_target(
    backend: str,
    base_url: str | None,
    model: str,
    prompt_format: str,
    knobs: KnobGrid,
    ignore_eos: bool = True,
    timeout_s: float = 6 * 3600,
) -> HttpTarget:
    """The server an HTTP backend run talks to; engine knobs are the server's business and refused here."""
    if not base_url:
        raise ValueError(f"base_url: --backend {backend} needs --base-url http://HOST:PORT")
    given = [k for k in knob_names() if knobs.axis(k) is not None]
    if given:
        flag = given[0].replace("_", "-")
        raise ValueError(
            f"--{flag}: an engine knob; with --backend {backend} set it on the server (e.g. cbbench serve --{flag} ...)"
        )
    return HttpTarget(backend, base_url, model, prompt_format=prompt_format, ignore_eos=ignore_eos, timeout_s=timeout_s)


def failure_notes(key: tuple[str, str, str], records: list[RequestRecord]) -> list[str]:
    """One line per run with failed requests (as vLLM's "Failed requests"), with the first error."""
    bad = [r for r in records if r.finish_reason == "error"]
    short = [r for r in records if r.finish_reason != "error" and r.output_len != r.requested_output_len]
    out = []
    if bad:
        out.append(f"{key[0]} {key[2]}: failed requests: {len(bad)} of {len(records)}; first: {bad[0].error}")
    if short:
        out.append(
            f"{key[0]} {key[2]}: {len(short)} requests generated other than max_tokens tokens (the server "
            f"stopped at EOS: it ignores ignore_eos, or --no-ignore-eos); e.g. request {short[0].request_id}: {short[0].output_len} of "
            f"{short[0].requested_output_len}"
        )
    return out


class HttpBackend(Backend):
    """An OpenAI-compatible server at `--base-url`; the endpoint is the registered name's (`http_client.ENDPOINTS`).
    Its engine knobs are the server's own: given here, they are refused while the plan is built."""

    send: ClassVar[Any] = None  # the request function; None: http_client.stream_request
    takes_salt: ClassVar[bool] = True  # its requests can carry vLLM's cache_salt
    args: HttpArgs
    isolation: Isolation | None = None  # what the server offers, asked by prepare() before the first run

    def __init__(self, settings: RunSettings, args: HttpArgs) -> None:
        super().__init__(settings, args)
        self.target = http_target(
            self.name,
            settings.base_url,
            settings.model,
            args.prompt_format,
            settings.engine_knobs,
            args.ignore_eos,
            args.request_timeout,
        )
        check_client_workers(args.client_workers)
        if args.prefix_cache_isolation == "salt" and not self.takes_salt:
            raise ValueError(
                f"prefix_cache_isolation: salt, but --backend {self.name}'s requests carry no cache_salt; "
                "use auto or reset"
            )

    def prepare(self) -> None:
        self.isolation = probe(self.target, self.args.prefix_cache_isolation, salt_possible=self.takes_salt)

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        return run_http(
            spec.workload,
            self.target,
            tokenizer=self.settings.tokenizer,
            max_concurrency=spec.load.max_concurrency,
            warmup=self.settings.warmup,
            seed=self.settings.seed,
            progress=progress,
            client_workers=self.args.client_workers,
            send=self.send,
            isolation=self.isolation,
        )

    def row_config(self, result: RunResult) -> tuple[dict[str, Any], str]:
        # device, dtype and knobs are the server's: left empty; where it was reached goes into `extra`
        t = self.target
        config: dict[str, Any] = {"base_url": t.base_url, "prompt_format": t.prompt_format, "ignore_eos": t.ignore_eos}
        scale = getattr(result, "sim_time_scale", None)
        if scale is not None:  # the times are the server's simulated time, converted at this mean scale
            config["sim_time_scale"] = round(scale, 4)
        isolation = getattr(result, "isolation", None)
        if isolation is not None:  # salt, reset, salt+reset, none (the server offers neither) or off
            config["prefix_cache_isolation"] = isolation.label
        return config, ""

    def notes(self, key: tuple[str, str, str], result: RunResult) -> list[str]:
        timing = getattr(result, "time_note", None)
        own = [f"{key[0]} {key[2]}: {timing}".replace("  ", " ")] if timing else []
        isolation = getattr(result, "isolation", None)
        warm = isolation.note(self.target.base_url) if isolation is not None else None
        if warm:  # (one line for the whole table: the caller drops repeated notes)
            own.append(warm)
        return own + failure_notes(key, result.records) + super().notes(key, result)


@Backend.register("openai", kind="server", args=HttpArgs)
class OpenAIBackend(HttpBackend):
    """/v1/completions."""


@Backend.register("openai-chat", kind="server", args=HttpArgs)
class OpenAIChatBackend(HttpBackend):
    """/v1/chat/completions."""
