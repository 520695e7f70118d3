"""Interpolation in the measured kernel tables of data/<gpu>.npz (extracted by ci/extract_sim_tables.py).

Three tables per GPU, all latencies in milliseconds as measured under vLLM:
- GEMM: a full grid over (m, n, k) per dtype. Between grid points, log latency is interpolated linearly in log m,
  log n and log k: exact wherever latency follows a power of each (a small-m GEMM streams its n * k weights, a
  large-m one computes m * n * k), and close in between.
- Decode attention: per (num_heads, num_kv_heads, head_dim), latency over (batch, kv length).
- Prefill attention: per (num_heads, num_kv_heads, head_dim), latency over (batch, prompt length), no prefix.
Past the last measured point a table is extended by its cost law (GEMM linear in m, n and k; decode linear in
kv length and batch; prefill quadratic in length, linear in batch). Shapes that the tables cannot cover return
None, and the cost model falls back to its roofline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
_ATTN_COLS = {"h": 0, "kvh": 1, "d": 2, "b": 3, "isl": 4, "step": 5, "ms": 6}


@dataclass(frozen=True)
class GemmGrid:
    log_m: np.ndarray  # (M,)
    log_n: np.ndarray  # (N,)
    log_k: np.ndarray  # (K,)
    log_ms: np.ndarray  # (M, N, K), gaps filled along m


def make_gemm_grid(m: np.ndarray, n: np.ndarray, k: np.ndarray, ms: np.ndarray) -> GemmGrid:
    log_m, log_n, log_k = (np.log(a.astype(np.float64)) for a in (m, n, k))
    norm = np.log(ms.astype(np.float64))
    for j in range(norm.shape[1]):  # a few (m, n, k) points were not measured: fill them along log m
        for i in range(norm.shape[2]):
            col = norm[:, j, i]
            ok = np.isfinite(col)
            if not ok.all() and ok.sum() >= 2:
                norm[~ok, j, i] = np.interp(log_m[~ok], log_m[ok], col[ok])
    # a weight shape never measured at all (h100: 65536 x 65536): the mean of its neighbours' curves, each moved
    # to this shape by the weight-streaming law (latency proportional to n * k)
    for j, i in zip(*np.nonzero(~np.isfinite(norm).any(axis=0))):
        near = [
            norm[:, jj, ii] + log_n[j] - log_n[jj] + log_k[i] - log_k[ii]
            for jj, ii in ((j - 1, i), (j + 1, i), (j, i - 1), (j, i + 1))
            if 0 <= jj < norm.shape[1] and 0 <= ii < norm.shape[2] and np.isfinite(norm[:, jj, ii]).all()
        ]
        if near:
            norm[:, j, i] = np.mean(near, axis=0)
    return GemmGrid(log_m, log_n, log_k, norm)


def _bracket(axis: np.ndarray, x: float) -> tuple[int, int, float]:
    """Indices of the grid points around x (clamped to the grid) and x's weight toward the upper one."""
    x = min(max(x, axis[0]), axis[-1])
    hi = int(np.searchsorted(axis, x))
    if hi == 0:
        return 0, 0, 0.0
    lo = hi - 1
    return lo, hi, float((x - axis[lo]) / (axis[hi] - axis[lo]))


class GemmCurve:
    """GEMM latency for one weight shape (n, k) as a function of m, cached per m."""

    def __init__(self, grid: GemmGrid, n: int, k: int) -> None:
        n0, n1, wn = _bracket(grid.log_n, math.log(n))
        k0, k1, wk = _bracket(grid.log_k, math.log(k))
        g = grid.log_ms
        plane = (1 - wn) * ((1 - wk) * g[:, n0, k0] + wk * g[:, n0, k1]) + wn * (
            (1 - wk) * g[:, n1, k0] + wk * g[:, n1, k1]
        )  # (M,) log ms along m
        n_in = min(max(n, math.exp(grid.log_n[0])), math.exp(grid.log_n[-1]))
        k_in = min(max(k, math.exp(grid.log_k[0])), math.exp(grid.log_k[-1]))
        # beyond the grid a wider or deeper GEMM costs proportionally more; below it the smallest one's time
        self._log_m = grid.log_m
        self._ms = np.exp(plane) * max(n / n_in, 1.0) * max(k / k_in, 1.0)
        self._m_max = math.exp(grid.log_m[-1])
        self._cache: dict[int, float] = {}
        self.valid = bool(np.isfinite(self._ms).all())

    def ms(self, m: int) -> float:
        hit = self._cache.get(m)
        if hit is None:
            if m <= self._m_max:
                hit = float(np.exp(np.interp(math.log(m), self._log_m, np.log(self._ms))))
            else:  # compute-bound past the largest measured m
                hit = float(self._ms[-1]) * m / self._m_max
            self._cache[m] = hit
        return hit


class AttentionTable:
    """Attention latency for one head shape over (batch, length), from the measured (batch, length, ms) rows.

    Each measured batch size is a row interpolated in log length; past its last measured length it grows by
    length ** length_power (1 for decode, which streams KV; 2 for prefill, which is quadratic). Between batch rows
    the log latency is interpolated in log batch; past the largest batch it grows linearly. A head shape other than
    the measured one is looked up at the length with the same work (length_scale): small calls keep the measured
    fixed cost, large ones scale with the work.
    """

    def __init__(
        self, batch: np.ndarray, length: np.ndarray, ms: np.ndarray, length_power: float, length_scale: float = 1.0
    ) -> None:
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []
        bs = np.unique(batch)
        for b in bs:
            sel = batch == b
            order = np.argsort(length[sel])
            self._rows.append((np.log(length[sel][order]), np.log(ms[sel][order])))
        self._log_b = np.log(bs.astype(np.float64))
        self._power = length_power
        self._log_length_scale = math.log(length_scale)
        self._cache: dict[tuple[int, int], float] = {}

    def _row_log_ms(self, row: int, log_len: float) -> float:
        xs, ys = self._rows[row]
        if log_len > xs[-1]:
            return float(ys[-1] + self._power * (log_len - xs[-1]))
        return float(np.interp(log_len, xs, ys))

    def ms(self, batch: int, length: int) -> float:
        key = (batch, length)
        hit = self._cache.get(key)
        if hit is None:
            log_len = math.log(max(length, 1)) + self._log_length_scale
            log_b = math.log(batch)
            lo, hi, w = _bracket(self._log_b, log_b)
            y = (1 - w) * self._row_log_ms(lo, log_len) + w * self._row_log_ms(hi, log_len)
            y += max(log_b - self._log_b[-1], 0.0)  # past the largest measured batch: linear in batch
            hit = math.exp(y)
            if len(self._cache) < 200_000:  # a bound on memory for very long runs
                self._cache[key] = hit
        return hit


def _pick_heads(pairs: list[tuple[int, int]], h: int, kvh: int) -> tuple[int, int]:
    """The measured (num_heads, num_kv_heads) nearest in GQA group size first, then in num_heads."""
    group = math.log(h / kvh)
    return min(pairs, key=lambda p: (round(abs(math.log(p[0] / p[1]) - group), 6), abs(math.log(p[0] / h)), -p[1]))


class KernelTables:
    """The measured tables of one GPU; lookups are cached per shape."""

    def __init__(self, gpu: str) -> None:
        path = DATA_DIR / f"{gpu}.npz"
        with np.load(path) as z:
            self.arrays = {key: z[key] for key in z.files}  # the raw extract, as data/SOURCE.md describes it
        self.vllm_version = str(self.arrays["vllm_version"])

    def has_gemm(self, dtype: str) -> bool:
        return f"gemm_{dtype}_ms" in self.arrays

    @functools.cache  # noqa: B019 -- tables live for the process (one per GPU, cached by load); nothing to leak
    def gemm_grid(self, dtype: str) -> GemmGrid:
        a = self.arrays
        return make_gemm_grid(a[f"gemm_{dtype}_m"], a[f"gemm_{dtype}_n"], a[f"gemm_{dtype}_k"], a[f"gemm_{dtype}_ms"])

    @functools.cache  # noqa: B019 -- tables live for the process (one per GPU, cached by load); nothing to leak
    def gemm(self, dtype: str, n: int, k: int) -> GemmCurve | None:
        if not self.has_gemm(dtype):
            return None
        curve = GemmCurve(self.gemm_grid(dtype), n, k)
        return curve if curve.valid else None

    @functools.cache  # noqa: B019 -- tables live for the process (one per GPU, cached by load); nothing to leak
    def attention(self, kind: str, kv_dtype: str, h: int, kvh: int, d: int) -> AttentionTable | None:
        """kind is "decode" (length = kv tokens) or "prefill" (length = prompt tokens, no prefix)."""
        rows = self.arrays.get(f"{kind}_{kv_dtype}")
        return None if rows is None else attention_table(rows, kind, h, kvh, d)


def attention_table(rows: np.ndarray, kind: str, h: int, kvh: int, d: int) -> AttentionTable | None:
    """The table for heads (h, kvh, d) from measured rows (data/SOURCE.md's layout), or None without head_dim d."""
    rows = rows[rows[:, _ATTN_COLS["d"]] == d].astype(np.float64)
    if len(rows) == 0:
        return None
    pairs = sorted({(int(r[0]), int(r[1])) for r in rows})
    h_e, kvh_e = _pick_heads(pairs, h, kvh)
    rows = rows[(rows[:, 0] == h_e) & (rows[:, 1] == kvh_e)]
    c = _ATTN_COLS
    if kind == "decode":  # the kernel attends over isl + step cached tokens; its work is the KV read: kvh * length
        length, power, scale = rows[:, c["isl"]] + rows[:, c["step"]], 1.0, kvh / kvh_e
    else:  # prefill's work is the query heads' FLOPs: h * length ** 2
        length, power, scale = rows[:, c["isl"]], 2.0, math.sqrt(h / h_e)
    return AttentionTable(rows[:, c["b"]], length, rows[:, c["ms"]], power, scale)


@functools.cache
def load_tables(gpu: str) -> KernelTables:
    return KernelTables(gpu)
