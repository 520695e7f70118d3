"""`cbbench serve`: refengine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn), shaped as vLLM's server.

Routes: POST /v1/completions, POST /v1/chat/completions (both streaming over SSE or not), GET /v1/models, /health,
/metrics (Prometheus text, vLLM's metric names), and vLLM's POST /tokenize, POST /detokenize, GET /version. Errors are OpenAI-shaped, `{"error": {"message", "type", "param",
"code"}}`: client input that the server refuses is a 400 naming the field (request-body validation included, which
FastAPI would answer with 422), an unknown model a 404. Only a failure of the engine itself is a 500; it fails the
requests in flight at that step and the server goes on serving.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from refengine.engine import LLMEngine
from refengine.entrypoints.async_engine import AsyncLLMEngine, EngineError
from refengine.entrypoints.chat import chat_renderer
from refengine.entrypoints.metrics import CONTENT_TYPE
from refengine.entrypoints.protocol import (BadRequest, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                            TokenizeRequest, error_body, now)
from refengine.entrypoints.serving import Call, OpenAIServing

log = logging.getLogger("refengine.server")
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Server stop (Ctrl-C, SIGTERM): open connections get this long to finish, then they are cancelled (their
# requests aborted, as vLLM's server cancels them at once) and the lifespan shuts the engine down.
GRACEFUL_SHUTDOWN_S = 5


def _error(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """Pydantic's first complaint, as OpenAI reports it: the field's dotted path as `param`."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return _error(f"the request body is not valid JSON: {msg}", 400)
    if first.get("type") == "missing" and not loc:
        return _error("the request body must be a JSON object", 400)
    return _error(f"{param}: {msg}" if param else msg, 400, param)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(engine: LLMEngine, model_name: str | None = None, model_path: str | None = None) -> FastAPI:
    """The ASGI app over `engine`. `model_name` is what clients put in "model" (default: the model argument)."""
    name = model_name or engine.config.model
    async_engine = AsyncLLMEngine(engine, name)
    render, _ = chat_renderer(model_path or engine.config.model)
    serving = OpenAIServing(async_engine, name, render)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        try:
            yield
        finally:  # server stop: the streams still open end aborted, the engine's worker thread exits
            await async_engine.shutdown()

    app = FastAPI(title="refengine", lifespan=lifespan)
    app.state.engine = async_engine

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
        return _error(str(exc), 500)

    @app.exception_handler(Exception)
    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

    def check_model(requested: str | None) -> None:
        if requested is not None and requested != name:
            raise BadRequest(f"The model `{requested}` does not exist.", "model", status=404)

    async def respond(request: Request, call: Call, stream: bool, priority: int) -> Any:
        await serving.submit(call, priority)
        if stream:
            return StreamingResponse(serving.stream(call), media_type="text/event-stream", headers=_SSE_HEADERS)
        # Not streaming: a client that hangs up while waiting must abort its requests too.
        body = asyncio.ensure_future(serving.full_response(call))
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
        return await respond(request, serving.completion_call(req), req.stream, req.priority)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        check_model(req.model)
        return await respond(request, serving.chat_call(req), req.stream, req.priority)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": now(), "owned_by": "refengine", "root": engine.config.model,
            "parent": None, "max_model_len": engine.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict:
        check_model(req.model)
        return serving.tokenize(req)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict:
        check_model(req.model)
        return serving.detokenize(req)

    @app.get("/version")
    async def version() -> dict:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        try:
            out = {"version": dist_version("cbbench")}
        except PackageNotFoundError:  # (run from a source tree that was never installed)
            out = {"version": "unknown"}
        if engine.sim is not None:  # clients (and the HTTP suite) must know the tokens and times are simulated
            out["simulated"] = engine.device_label
        return out

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(async_engine.metrics.render(), media_type=CONTENT_TYPE)

    return app


def run_server(engine_kwargs: dict, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
               log_level: str = "info") -> None:
    """Load the engine (bad knobs raise ValueError before the port is bound), then serve until interrupted."""
    import uvicorn

    # The server reads each step's stats once and drops them; keeping one is enough (see AsyncLLMEngine).
    engine = LLMEngine(**{"stats_log_size": 1, **engine_kwargs})
    app = build_app(engine, served_model_name)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    log.info("serving %s on http://%s:%d (num_gpu_blocks=%d)", served_model_name or engine.config.model, host,
             port, engine.scheduler.config.num_gpu_blocks)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=30,
                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    finally:  # the lifespan has normally shut it down already (idempotent); never while its thread may step it
        if not app.state.engine.is_running():
            engine.shutdown()
