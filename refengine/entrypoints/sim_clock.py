"""How a served simulated GPU reports its clock, so that clients can convert what they measure on the wall clock
into simulated time: the pacer runs `scale` simulated seconds per wall second (refengine/sim/pacing.py; 1 is real
time, less where the host cannot keep up).

- every response carries the header `x-sim-time-scale: <scale>` (the scale when it started);
- /metrics exports `cbbench:sim_time_scale`, and one point of the wall-to-simulated mapping read at one moment:
  `cbbench:sim_clock_seconds` (the simulated clock) and `cbbench:sim_wall_clock_seconds` (the server's monotonic
  wall clock). A client that samples them more often than the scale may change (time_scale.MIN_DWELL_S) rebuilds
  the whole piecewise-linear mapping (perf/backends/sim_time.py);
- GET /version carries `sim_time_scale` beside `simulated`.
A real device, or a simulated one served unpaced, reports none of these.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from refengine.entrypoints.server_limits import ASGIApp, Message, Receive, Scope, Send
from refengine.worker.device import Pacer

HEADER = b"x-sim-time-scale"


def scale_text(scale: float) -> str:
    return f"{scale:g}"


class SimClockGauges:
    """The /metrics gauges of the simulated clock; `update()` reads the pacer once, just before a render."""

    def __init__(self, pacer: Pacer, registry: CollectorRegistry) -> None:
        self.pacer = pacer
        self.scale = Gauge(
            "cbbench:sim_time_scale", "Simulated seconds per wall second of the served clock.", registry=registry
        )
        self.clock = Gauge(
            "cbbench:sim_clock_seconds",
            "The simulated clock, read with cbbench:sim_wall_clock_seconds.",
            registry=registry,
        )
        self.wall = Gauge(
            "cbbench:sim_wall_clock_seconds", "The server's monotonic wall clock at that moment.", registry=registry
        )

    def update(self) -> None:
        wall, virtual, scale = self.pacer.reading()
        self.scale.set(scale)
        self.clock.set(virtual)
        self.wall.set(wall)


class SimClockHeader:
    """ASGI middleware: every response gets `x-sim-time-scale`, the pacer's scale when the response starts."""

    def __init__(self, app: ASGIApp, pacer: Pacer) -> None:
        self.app, self.pacer = app, pacer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_scale(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (HEADER, scale_text(self.pacer.scale).encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_scale)
