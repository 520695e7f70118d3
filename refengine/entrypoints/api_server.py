"""`cbbench serve`: refengine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn), shaped as vLLM's server.

Routes: POST /v1/completions, POST /v1/chat/completions (both streaming over SSE or not), GET /v1/models, /health,
/metrics (Prometheus text, vLLM's metric names), and vLLM's POST /tokenize, POST /detokenize, GET /version and POST
/reset_prefix_cache (a development route in vLLM; here always on, behind the API key as every route but /health and
/metrics: 200 `{"success": true}` once every cached prefix is forgotten, 409 while a request holds KV blocks, which
vLLM's engine refuses too, where vLLM's route answers 200 whatever the engine said). Errors are OpenAI-shaped, `{"error": {"message", "type", "param",
"code"}}`: client input that the server refuses is a 400 naming the field (request-body validation included, which
FastAPI would answer with 422), an unknown model a 404, every other 4xx a client-error type. Only a failure of the
engine itself is a 500; it fails the requests in flight at that step and the server goes on serving. Error messages
say what the client sent wrong, never a server exception's text (that goes to the log).

In front of the routes: `Gate` (API key, the drain on shutdown; access.py), then `BodyLimit` (limits.py). The
server process itself (port checks, uvicorn's limits, the graceful stop) is launch.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.access import Drain, Gate
from refengine.entrypoints.async_engine import AsyncLLMEngine, EngineError
from refengine.entrypoints.chat import chat_renderer
from refengine.entrypoints.docs_page import render_docs
from refengine.entrypoints.prometheus_metrics import CONTENT_TYPE
from refengine.entrypoints.protocol import (
    LONE_SURROGATE,
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    error_body,
    now,
)
from refengine.entrypoints.responses import full_response, stream_response
from refengine.entrypoints.server_limits import BodyLimit
from refengine.entrypoints.serving import ENGINE_FAILED, Call, OpenAIServing, ShutdownAbort
from refengine.entrypoints.sim_clock import SimClockGauges, SimClockHeader

log = logging.getLogger("refengine.server")
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


_UNION_TAG = re.compile(r"^(str|int|float|bool|(list|dict)\[.*\])$")  # how pydantic names a union's branches


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """Pydantic's first complaint, as OpenAI reports it: the field's dotted path as `param`. A field of several
    accepted types (prompt, stop) is reported once, with the types, not as its first branch's complaint."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = first.get("msg", "invalid request")
    if first.get("type") == LONE_SURROGATE:  # found anywhere in the body: the field is in the error's context
        field = str((first.get("ctx") or {}).get("field") or "") or None
        return _error(msg, 400, field)
    if first.get("type") == "json_invalid":
        return _error(f"the request body is not valid JSON: {msg}", 400)
    if first.get("type") == "missing" and not loc:
        return _error("the request body must be a JSON object", 400)
    tag = next((i for i, part in enumerate(loc) if _UNION_TAG.match(part)), None)
    if tag is not None:
        param = ".".join(loc[:tag])
        kinds = dict.fromkeys(
            str(e["loc"][tag + 1])
            for e in errors
            if [str(p) for p in e["loc"][1 : tag + 1]] == loc[:tag] and len(e["loc"]) > tag + 1
        )
        return _error(f"{param}: the value is none of the accepted types ({', '.join(kinds)})", 400, param)
    where = ".".join(loc) or None
    return _error(f"{where}: {msg}" if where else msg, 400, where)


# The engine thread shares this process's GIL, and a step takes it back after every torch op: while another thread
# runs Python or a long C call, a step waits out that whole run (encoding in slices does not help: a step needs the
# GIL dozens of times). So a large answer costs the engine the GIL time of its encoding, and id lists this long are
# encoded by `str`, the fastest encoder at hand (a list of ints prints as JSON), ahead of json.dumps and of joining
# slices. The measurements: docs/serving-limits.md, "What never runs on the event loop".
_LARGE_ID_LIST = 20_000


def _dumps_large(body: dict[str, Any]) -> bytes:
    parts = []
    for key, value in body.items():
        if isinstance(value, list) and len(value) > _LARGE_ID_LIST and type(value[0]) is int:
            encoded = str(value)
        else:
            encoded = json.dumps(value, ensure_ascii=False)
        parts.append(f"{json.dumps(key)}:{encoded}")
    return ("{" + ",".join(parts) + "}").encode()


async def _json_off_loop(body: dict[str, Any]) -> Response:
    """A large answer (a /tokenize of megabytes) is encoded in a worker thread: FastAPI would walk it on the loop."""
    return Response(await asyncio.to_thread(_dumps_large, body), media_type="application/json")


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _install_error_handlers(app: FastAPI) -> None:
    """Every error OpenAI-shaped, typed by status; a server-side failure logged, never echoed to the client."""

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc)

    @app.exception_handler(BadRequest)
    async def on_bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(str(exc), exc.status, exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(str(exc.detail), exc.status_code)

    @app.exception_handler(ValueError)
    async def on_value(_: Request, exc: ValueError) -> JSONResponse:  # refused input the handlers did not name
        return _error(str(exc), 400)

    @app.exception_handler(EngineError)
    async def on_engine(_: Request, exc: EngineError) -> JSONResponse:
        log.error("engine error: %s", exc)
        return _error(ENGINE_FAILED, 500)

    @app.exception_handler(ShutdownAbort)
    async def on_shutdown(_: Request, exc: ShutdownAbort) -> JSONResponse:
        return _error(str(exc), 503)

    @app.exception_handler(Exception)
    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error("internal server error (see the server log)", 500)


def _add_service_routes(app: FastAPI, serving: OpenAIServing, check_model: Any, disable_docs: bool) -> None:
    """vLLM's /tokenize, /detokenize, /version; /health, /metrics; the offline /docs page."""
    async_engine = serving.engine
    pacer = async_engine.pacer  # a served simulated GPU reports its clock (sim_clock.py)
    gauges = SimClockGauges(pacer, async_engine.metrics.registry) if pacer else None

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> Response:
        check_model(req.model)
        return await _json_off_loop(await serving.tokenize(req))

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> Response:
        check_model(req.model)
        return await _json_off_loop(await serving.detokenize(req))

    @app.get("/version")
    async def version() -> dict[str, str | float]:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        out: dict[str, str | float]
        try:
            out = {"version": dist_version("cbbench")}
        except PackageNotFoundError:  # (run from a source tree that was never installed)
            out = {"version": "unknown"}
        engine = async_engine.engine
        if engine.platform.simulated:  # clients (and the HTTP suite) must know the tokens and times are simulated
            out["simulated"] = engine.device_label
            if pacer:
                out["sim_time_scale"] = pacer.scale
        return out

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        if request.query_params.get("reset_running_requests", "false").lower() not in ("false", "0"):
            raise BadRequest(
                "reset_running_requests is not supported: this server resets only while no request holds KV blocks",
                "reset_running_requests",
            )
        if not await serving.reset_prefix_cache():
            raise BadRequest(
                "the prefix cache was not reset: requests still hold KV blocks; reset once they have finished",
                status=409,
            )
        return JSONResponse({"success": True})

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        if gauges:
            gauges.update()
        return Response(async_engine.metrics.render(), media_type=CONTENT_TYPE)

    if not disable_docs:

        @app.get("/docs", include_in_schema=False)
        async def docs() -> HTMLResponse:
            return HTMLResponse(render_docs(app.openapi()))


def build_app(
    engine: LLMEngine,
    model_name: str | None = None,
    model_path: str | None = None,
    api_key: str | None = None,
    disable_docs: bool = False,
    time_scale: float | None = None,
) -> FastAPI:
    """The ASGI app over `engine`. `model_name` is what clients put in "model" (default: the model argument);
    `api_key`: required as a Bearer token on all routes but /health and /metrics; `disable_docs`: no /docs and
    no /openapi.json (vLLM's --disable-fastapi-docs); `time_scale`: a simulated GPU's served clock in simulated
    seconds per wall second (None: as fast as this host keeps up with, at most real time)."""
    name = model_name or engine.config.model
    async_engine = AsyncLLMEngine(engine, name, time_scale=time_scale)
    render, _ = chat_renderer(model_path or engine.config.model)
    serving = OpenAIServing(async_engine, name, render)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:  # server stop: the streams still open end aborted, the engine's worker thread exits
            await async_engine.shutdown()

    app = FastAPI(
        title="refengine",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None if disable_docs else "/openapi.json",
    )
    app.state.engine, app.state.serving, app.state.drain = async_engine, serving, Drain()
    app.add_middleware(BodyLimit)
    app.add_middleware(Gate, drain=app.state.drain, api_key=api_key)  # before any body is read
    if async_engine.pacer:  # outermost: Gate's own refusals carry the scale too
        app.add_middleware(SimClockHeader, pacer=async_engine.pacer)

    _install_error_handlers(app)

    def check_model(requested: str | None) -> None:
        if requested is not None and requested != name:
            raise BadRequest(f"The model `{requested}` does not exist.", "model", status=404)

    async def respond(request: Request, call: Call, stream: bool, priority: int) -> Any:
        await serving.submit(call, priority)
        if stream:
            return StreamingResponse(
                stream_response(serving, call), media_type="text/event-stream", headers=_SSE_HEADERS
            )
        # Not streaming: a client that hangs up while waiting must abort its requests too.
        body = asyncio.ensure_future(full_response(serving, call))
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait({body, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not body.done():
                body.cancel()
                serving.abort(call)
        if not body.done() or body.cancelled():
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        return JSONResponse(body.result())

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        check_model(req.model)
        return await respond(request, await serving.completion_call(req), req.stream, req.priority)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        check_model(req.model)
        return await respond(request, await serving.chat_call(req), req.stream, req.priority)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": now(),
                    "owned_by": "refengine",
                    "root": engine.config.model,
                    "parent": None,
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    _add_service_routes(app, serving, check_model, disable_docs)
    return app
