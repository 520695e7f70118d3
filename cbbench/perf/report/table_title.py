"""The perf table's title (the model and its tensor-parallel size, the workload, its arrivals, the simulated GPU when
the rows ran on one) and the parse of
a table cell as a number, which the table (table.py) shares."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import SupportsFloat, SupportsIndex

from refengine.sim.sim_device import DeviceSpec


def cell_number(v: object) -> float:
    """A CSV or row value as a float; nan for an empty or non-numeric cell."""
    if not isinstance(v, (SupportsFloat, SupportsIndex, str, bytes)):
        return math.nan  # (what float() refuses with a TypeError: None, a list, ...)
    try:
        return float(v)
    except ValueError:
        return math.nan


def describe_arrivals(params: Mapping[str, object], rows: Sequence[Mapping[str, object]] = ()) -> str:
    """The request rate as the title says it: offline, Poisson at R/s, gamma arrivals with their burstiness, or the
    rates of a sweep (when the rows hold several)."""
    rates = sorted({v for v in (cell_number(r.get("request_rate")) for r in rows) if not math.isnan(v)})
    if len(rates) > 1:
        return "request rates " + ", ".join("inf" if math.isinf(r) else f"{r:g}" for r in rates) + " /s"
    rate, burst = cell_number(params.get("request_rate", math.inf)), cell_number(params.get("burstiness", 1.0))
    if math.isnan(rate) or math.isinf(rate):
        return "request rate inf (all at t0)"
    kind = "Poisson" if math.isnan(burst) or burst == 1.0 else f"gamma, burstiness {burst:g}"
    return f"request rate {rate:g}/s ({kind})"


def simulated_heading(rows: Sequence[Mapping[str, object]]) -> str:
    """ "simulated H200 (cost model <version>, bfloat16)" when the rows ran on a `sim:<gpu>` device, else ""."""
    devices = ((r, DeviceSpec.parse(str(r.get("device") or "cpu"))) for r in rows)
    sim, device = next(((r, d) for r, d in devices if d.simulated), (None, None))
    if sim is None or device is None:
        return ""
    opts = sim.get("run_options") or "{}"
    parsed = json.loads(opts) if isinstance(opts, str) else opts
    version = parsed.get("cost_model", "?") if isinstance(parsed, Mapping) else "?"
    return f"{device.label} (cost model {version}, {sim.get('dtype')})"


def model_heading(rows: Sequence[Mapping[str, object]]) -> str:
    """ "llama-3.1-70b, tensor parallel 4": the model when the rows share one, and the tensor-parallel size(s) when a
    row splits the model over GPUs ("" for neither)."""
    models = {
        str(r.get("model")) for r in rows if r.get("model") not in (None, "") and r.get("model") == r.get("model")
    }
    sizes = sorted({int(v) for r in rows if not math.isnan(v := cell_number(r.get("tensor_parallel_size")))})
    parts = [next(iter(models))] if len(models) == 1 else []
    if any(tp > 1 for tp in sizes):
        parts.append("tensor parallel " + ", ".join(map(str, sizes)))
    return ", ".join(parts)


def table_title(
    name: str, summary: Mapping[str, object], params: Mapping[str, object], rows: Sequence[Mapping[str, object]] = ()
) -> str:
    s = summary
    sim, model = simulated_heading(rows), model_heading(rows)
    return (
        f"cbbench perf{' of ' + model if model else ''}{(',' if ',' in model else '') + ' on a ' + sim if sim else ''}: {name}, {s['num_requests']} requests, {describe_arrivals(params, rows)}, prompt mean "
        f"{s['mean_prompt_len']:.0f} (max {s['max_prompt_len']}), output mean {s['mean_output_len']:.0f} "
        f"(max {s['max_output_len']}, cv {s['cv_output_len']:.2f})"
    )
