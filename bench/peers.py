"""Times the peer attention implementations (PyTorch SDPA backends, expanded-K/V SDPA, compiled
FlexAttention) on the shapes of a bench/sweeps/*.csv, writing rows in the CSV format of
shared/BENCHMARKS.md "Outputs" (the same columns as the gqattn-bench CLI).
Layer: bench (Python, torch). Every peer call is guarded: a failure becomes a `fail: ...` row.
"""
from __future__ import annotations

import argparse
import csv
import gc
import itertools
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

COLUMNS = ["family", "impl", "dtype", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
           "batch", "qo_len", "kv_len", "causal", "median_us", "achieved", "unit",
           "pct_of_ceiling", "status"]
ALL_PEERS = ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "expand_sdpa", "flex"]
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
NO_KERNEL_MARKERS = ("No available kernel", "No viable backend")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

MB = 1e6
ROTATION_TARGET_BYTES = 240 * MB  # 4x the H200's 60 MB L2: rotated inputs never fit in it
MAX_SETS = 8                      # cap on rotated input sets; an L2 flush covers the rest
FLUSH_BYTES = 256 * MB            # read before each rep when rotation alone stays under the target
SLEEP_US = 200.0                  # spin kernel before each rep hides Python launch overhead
SLOW_CALL_S = 0.05                # calls slower than this get fewer reps...
PEER_BUDGET_S = 2.0               # ...so that one peer on one config takes about this long
MIN_SLOW_REPS = 10
WARMUP_REPS = 3
ESTIMATE_REPS = 3
REASON_CHARS = 120
CHECK_RTOL = 2e-2                 # output check: |out - ref| <= rtol * max|ref| + atol
CHECK_ATOL = 2e-3
DYNAMO_RECOMPILE_LIMIT = 4096     # flex compiles once per shape (dynamic=False)
CEILING_BYTES = {"cuda": 4 * 2**30, "cpu": 64 * 2**20}
GEMM_N = {"cuda": 8192, "cpu": 512}
CEILING_REPS = 30
READ_BLOCK = 16384                # elements per program of the streaming-read kernel


class ContextLost(RuntimeError):
    """The CUDA context is unusable (sticky error): nothing after this can be measured."""


@dataclass(frozen=True)
class Case:
    """One row of a sweep CSV."""
    family: str
    dtype: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    batch: int
    qo_len: int
    kv_len: int
    causal: int

    def label(self) -> str:
        return (f"{self.family} Hq{self.num_qo_heads}/Hkv{self.num_kv_heads} D{self.head_dim} "
                f"p{self.page_size} B{self.batch} qo{self.qo_len} kv{self.kv_len} c{self.causal}")

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def mask_kind(self) -> str:
        """none, is_causal (top-left == bottom-right when qo_len == kv_len) or explicit."""
        if not self.causal or self.qo_len == 1:
            return "none"
        return "is_causal" if self.qo_len == self.kv_len else "explicit"


@dataclass
class Inputs:
    """One buffer set: q [B, Hq, qo_len, D], k/v [B, Hkv, kv_len, D], contiguous."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


@dataclass
class Ceilings:
    read_gbps: float = 0.0
    copy_gbps: float = 0.0
    gemm_tflops: float = 0.0


@dataclass
class Result:
    median_us: float = 0.0
    achieved: float = 0.0
    unit: str = ""
    pct_of_ceiling: float = 0.0
    status: str = "ok"


PeerFn = Callable[[Inputs], torch.Tensor]
SPIN: Optional[Callable[[int], None]] = getattr(torch.cuda, "_sleep", None)  # GPU spin, in cycles


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_sweep(path: Path) -> list[Case]:
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("family", "").strip()]
    ints = [name for name in Case.__dataclass_fields__ if name not in ("family", "dtype")]
    return [Case(family=r["family"].strip(), dtype=r["dtype"].strip(),
                 **{name: int(r[name]) for name in ints}) for r in rows]


# ---- figures ---------------------------------------------------------------------------------

def elem_bytes(case: Case) -> int:
    return torch.empty(0, dtype=DTYPES[case.dtype]).element_size()


def decode_bytes(case: Case) -> float:
    """K + V of kv_len tokens + Q + O, as bench/bench_case.cc counts them."""
    kv = 2 * case.batch * case.kv_len * case.num_kv_heads * case.head_dim
    qo = 2 * case.batch * case.qo_len * case.num_qo_heads * case.head_dim
    return float((kv + qo) * elem_bytes(case))


def prefill_flops(case: Case) -> float:
    """4 * visible (query, key) pairs * Hq * D per request; new tokens sit at the end of KV."""
    q, kv = case.qo_len, case.kv_len
    pairs = q * (kv - q) + q * (q + 1) / 2 if case.causal else q * kv
    return 4.0 * pairs * case.num_qo_heads * case.head_dim * case.batch


def to_result(case: Case, seconds: float, ceilings: Ceilings) -> Result:
    if case.family == "decode":
        achieved, unit, ceiling = decode_bytes(case) / seconds / 1e9, "GB/s", ceilings.read_gbps
    else:
        achieved, unit = prefill_flops(case) / seconds / 1e12, "TFLOP/s"
        ceiling = ceilings.gemm_tflops
    pct = 100.0 * achieved / ceiling if ceiling > 0 else 0.0
    return Result(seconds * 1e6, achieved, unit, pct)


def unit_of(case: Case) -> str:
    return "GB/s" if case.family == "decode" else "TFLOP/s"


# ---- timing ----------------------------------------------------------------------------------

class Timer:
    """Times calls one by one: CUDA events on a GPU (after an optional L2 flush and a spin kernel
    that lets the CPU queue the call before the GPU reaches it), perf_counter on a CPU."""

    def __init__(self, device: torch.device, settle_ms: int = 0) -> None:
        self.device = device
        self.settle_ms = settle_ms
        self.sleep_cycles = self._calibrate_sleep() if device.type == "cuda" and SPIN else 0

    def settle(self) -> None:
        """The GPU idle for settle_ms before the timed calls, as gqattn-bench --settle-ms does
        before its own: the card's power average, and with it the SM clock, recovers from the
        rows before (docs/perf-notes.md, item 153)."""
        if self.settle_ms > 0:
            sync(self.device)
            time.sleep(self.settle_ms / 1000)

    @staticmethod
    def _calibrate_sleep() -> int:
        probe_cycles = 1_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        SPIN(probe_cycles)
        start.record()
        SPIN(probe_cycles)
        end.record()
        torch.cuda.synchronize()
        cycles_per_us = probe_cycles / max(start.elapsed_time(end) * 1e3, 1.0)
        return int(SLEEP_US * cycles_per_us)

    def times(self, call: Callable[[], object], reps: int,
              flush: Optional[torch.Tensor] = None) -> list[float]:
        """Seconds of each of `reps` calls."""
        if self.device.type != "cuda":
            return self._cpu_times(call, reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            if flush is not None:
                flush.sum(dtype=torch.float32)
            if self.sleep_cycles:
                SPIN(self.sleep_cycles)
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]

    @staticmethod
    def _cpu_times(call: Callable[[], object], reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out

    def median(self, call: Callable[[], object], reps: int,
               flush: Optional[torch.Tensor] = None) -> float:
        return statistics.median(self.times(call, reps, flush))


def rotating(fn: PeerFn, sets: list[Inputs]) -> Callable[[], torch.Tensor]:
    """A call that runs fn on the next buffer set each time."""
    it = itertools.cycle(sets)
    return lambda: fn(next(it))


def reps_for(estimate_s: float, iters: int) -> int:
    if estimate_s <= SLOW_CALL_S:
        return iters
    return max(MIN_SLOW_REPS, min(iters, int(PEER_BUDGET_S / estimate_s)))


# ---- ceilings --------------------------------------------------------------------------------

if triton is not None:
    @triton.jit
    def _read_kernel(x_ptr, partial_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        x = tl.load(x_ptr + pid * BLOCK + tl.arange(0, BLOCK))
        tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def streaming_read_fn(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A read of every element of x: Triton with 16-byte loads on a GPU, torch.sum elsewhere."""
    if triton is None or x.device.type != "cuda":
        return lambda: x.sum(dtype=torch.float32)
    partial = torch.empty(x.numel() // READ_BLOCK, dtype=torch.float32, device=x.device)
    grid = (partial.numel(),)
    return lambda: _read_kernel[grid](x, partial, BLOCK=READ_BLOCK, num_warps=8)


def time_ceiling(timer: Timer, call: Callable[[], object]) -> float:
    call()
    return timer.median(call, CEILING_REPS)


def measure_read(timer: Timer) -> tuple[float, float]:
    """(GB/s, seconds) of a streaming read of CEILING_BYTES."""
    nbytes = CEILING_BYTES[timer.device.type]
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=timer.device)
    seconds = time_ceiling(timer, streaming_read_fn(x))
    return nbytes / seconds / 1e9, seconds


def measure_copy(timer: Timer) -> tuple[float, float]:
    """(GB/s counting bytes read + written, seconds) of a device-to-device copy_."""
    nbytes = CEILING_BYTES[timer.device.type]
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=timer.device)
    dst = torch.empty_like(src)
    seconds = time_ceiling(timer, lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e9, seconds


def measure_gemm(timer: Timer) -> tuple[float, float]:
    """(TFLOP/s, seconds) of an n^3 bf16 torch.matmul (cuBLAS on a GPU)."""
    n = GEMM_N[timer.device.type]
    a = torch.randn(n, n, dtype=torch.bfloat16, device=timer.device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=timer.device)
    c = torch.empty(n, n, dtype=torch.bfloat16, device=timer.device)
    seconds = time_ceiling(timer, lambda: torch.matmul(a, b, out=c))
    return 2.0 * n**3 / seconds / 1e12, seconds


CEILING_MEASURES = [("read_bw_torch", "GB/s", measure_read, "read_gbps"),
                    ("copy_bw_torch", "GB/s", measure_copy, "copy_gbps"),
                    ("gemm_bf16_torch", "TFLOP/s", measure_gemm, "gemm_tflops")]
# Ceiling impl names as the CLI writes them (read, copy, gemm) or as BENCHMARKS-era docs name them.
CEILING_IMPLS = {"read": "read_gbps", "read_bw": "read_gbps", "copy": "copy_gbps",
                 "copy_bw": "copy_gbps", "gemm": "gemm_tflops", "gemm_bf16": "gemm_tflops"}


def read_ceilings(path: Path) -> Ceilings:
    """Ceiling rows (family=ceiling, status ok) of a CLI CSV; the CLI's names win over *_torch.
    A missing file or row leaves the ceiling at 0 (then measured here)."""
    found = Ceilings()
    if not path.exists():
        log(f"warning: ceilings file {path} not found; measuring the ceilings here")
        return found
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r.get("family") == "ceiling" and (r.get("status") or "").startswith("ok")]
    for r in sorted(rows, key=lambda r: r["impl"].endswith("_torch"), reverse=True):
        field = CEILING_IMPLS.get(r["impl"].removesuffix("_torch"))
        try:
            value = float(r["achieved"])
        except ValueError:
            continue
        if field and value > 0:
            setattr(found, field, value)
    return found


def measure_ceilings(timer: Timer, have: Ceilings, out: "RowWriter") -> Ceilings:
    """Measures each ceiling `have` lacks and writes it as a ceiling row."""
    for impl, unit, measure, field in CEILING_MEASURES:
        if getattr(have, field) > 0:
            continue
        result = Result(unit=unit)
        try:
            result.achieved, seconds = measure(timer)
            result.median_us = seconds * 1e6
            setattr(have, field, result.achieved)
        except Exception as exc:  # a failed ceiling is reported, the run goes on
            result.status = "fail: " + short_reason(exc, [])
        free_memory()
        log(f"ceiling {impl}: {result.achieved:.1f} {unit} ({result.status})")
        out.ceiling(impl, result)
    return have


# ---- inputs ----------------------------------------------------------------------------------

def set_bytes(case: Case) -> int:
    q_o = 2 * case.batch * case.num_qo_heads * case.qo_len * case.head_dim
    k_v = 2 * case.batch * case.num_kv_heads * case.kv_len * case.head_dim
    return (q_o + k_v) * elem_bytes(case)


def num_sets(case: Case) -> int:
    return max(1, min(MAX_SETS, math.ceil(ROTATION_TARGET_BYTES / set_bytes(case))))


def make_inputs(case: Case, device: torch.device) -> Inputs:
    dt = DTYPES[case.dtype]
    b, d = case.batch, case.head_dim
    q = torch.randn(b, case.num_qo_heads, case.qo_len, d, dtype=dt, device=device)
    k = torch.randn(b, case.num_kv_heads, case.kv_len, d, dtype=dt, device=device)
    v = torch.randn(b, case.num_kv_heads, case.kv_len, d, dtype=dt, device=device)
    return Inputs(q, k, v)


def make_flush(case: Case, device: torch.device) -> Optional[torch.Tensor]:
    if device.type != "cuda" or num_sets(case) * set_bytes(case) >= ROTATION_TARGET_BYTES:
        return None
    return torch.ones(int(FLUSH_BYTES) // 2, dtype=torch.bfloat16, device=device)


def visible(case: Case, device: torch.device, rows: Optional[list[int]] = None) -> torch.Tensor:
    """Boolean [len(rows), kv_len] (rows default: all qo_len): query i sees key
    j <= i + kv_len - qo_len (causal aligned bottom-right, to the end of the KV)."""
    rows = rows if rows is not None else list(range(case.qo_len))
    qi = torch.tensor(rows, device=device)[:, None]
    kj = torch.arange(case.kv_len, device=device)[None, :]
    return kj <= qi + (case.kv_len - case.qo_len)


# ---- peers -----------------------------------------------------------------------------------

def sdpa_kwargs(case: Case, device: torch.device) -> dict:
    kind = case.mask_kind
    if kind == "explicit":
        return {"attn_mask": visible(case, device)}
    return {"is_causal": kind == "is_causal"}


def make_sdpa(backend: SDPBackend, case: Case, device: torch.device) -> PeerFn:
    kwargs = sdpa_kwargs(case, device)

    def run(x: Inputs) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(x.q, x.k, x.v, enable_gqa=True, **kwargs)
    return run


def make_expand_sdpa(case: Case, device: torch.device) -> PeerFn:
    kwargs, group = sdpa_kwargs(case, device), case.group_size

    def run(x: Inputs) -> torch.Tensor:
        k = x.k.repeat_interleave(group, dim=1)
        v = x.v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(x.q, k, v, **kwargs)
    return run


_compiled_flex: Optional[Callable] = None


def compiled_flex() -> Callable:
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, DYNAMO_RECOMPILE_LIMIT)
        for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4 * DYNAMO_RECOMPILE_LIMIT)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_block_mask(case: Case, device: torch.device):
    if case.mask_kind == "none":
        return None
    from torch.nn.attention.flex_attention import create_block_mask
    offset = case.kv_len - case.qo_len

    def causal_bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    return create_block_mask(causal_bottom_right, None, None, case.qo_len, case.kv_len,
                             device=device)


def make_flex(case: Case, device: torch.device) -> PeerFn:
    flex, block_mask = compiled_flex(), flex_block_mask(case, device)

    def run(x: Inputs) -> torch.Tensor:
        return flex(x.q, x.k, x.v, block_mask=block_mask, enable_gqa=True)
    return run


def make_peer(name: str, case: Case, device: torch.device) -> PeerFn:
    if name in SDPA_BACKENDS:
        return make_sdpa(SDPA_BACKENDS[name], case, device)
    if name == "expand_sdpa":
        return make_expand_sdpa(case, device)
    return make_flex(case, device)


# ---- checking --------------------------------------------------------------------------------

def reference_rows(case: Case, x: Inputs, b: int, rows: list[int]) -> torch.Tensor:
    """fp32 attention of request b at query rows `rows`: [Hq, len(rows), D]."""
    hkv, g, d = case.num_kv_heads, case.group_size, case.head_dim
    q = x.q[b, :, rows, :].float().reshape(hkv, g * len(rows), d)
    k, v = x.k[b].float(), x.v[b].float()
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    if case.causal:
        keep = visible(case, x.q.device, rows).repeat(g, 1)
        scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.reshape(case.num_qo_heads, len(rows), d)


def check_output(case: Case, x: Inputs, out: torch.Tensor) -> Optional[str]:
    """None when out matches an fp32 reference at the first and last query rows of the first
    and last requests, else the reason."""
    expected_shape = (case.batch, case.num_qo_heads, case.qo_len, case.head_dim)
    if tuple(out.shape) != expected_shape:
        return f"wrong output shape {tuple(out.shape)}"
    rows = sorted({0, case.qo_len - 1})
    for b in sorted({0, case.batch - 1}):
        ref = reference_rows(case, x, b, rows)
        got = out[b, :, rows, :].float()
        if not torch.isfinite(got).all():
            return "non-finite output"
        err = (got - ref).abs().max().item()
        if err > CHECK_RTOL * ref.abs().max().item() + CHECK_ATOL:
            return f"wrong output (max err {err:.3g})"
    return None


# ---- one peer on one case --------------------------------------------------------------------

def sanitize(text: str) -> str:
    return " ".join(text.replace(",", ";").replace('"', "'").split())[:REASON_CHARS]


def short_reason(exc: BaseException, caught: list) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "OOM"
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("backend=")] or [type(exc).__name__]
    reason = lines[0]
    if any(marker in reason for marker in NO_KERNEL_MARKERS):
        why = [str(w.message) for w in caught if "not used because" not in str(w.message)]
        reason = "no kernel" + (": " + "; ".join(why) if why else "")
    return sanitize(reason)


def first_call(fn: PeerFn, case: Case, x: Inputs) -> Optional[str]:
    """Runs fn once (compiling it if need be) and checks it; None when all is well."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(x)
            sync(x.q.device)
        except Exception as exc:
            assert_context_alive(x.q.device)
            return short_reason(exc, caught)
    return check_output(case, x, out)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def assert_context_alive(device: torch.device) -> None:
    try:
        sync(device)
    except Exception as exc:
        raise ContextLost(sanitize(str(exc))) from exc


def time_peer(fn: PeerFn, case: Case, sets: list[Inputs], flush: Optional[torch.Tensor],
              timer: Timer, iters: int) -> tuple[float, int]:
    """Median seconds of fn over rotated sets after a warm-up, and the reps it took."""
    call = rotating(fn, sets)
    timer.times(call, WARMUP_REPS, flush)
    timer.settle()
    reps = reps_for(timer.median(call, ESTIMATE_REPS, flush), iters)
    return timer.median(call, reps, flush), reps


def run_peer(name: str, case: Case, sets: list[Inputs], flush: Optional[torch.Tensor],
             timer: Timer, iters: int, ceilings: Ceilings) -> Result:
    device = sets[0].q.device
    t0 = time.perf_counter()
    try:
        fn = make_peer(name, case, device)
        failure = first_call(fn, case, sets[0])
        if failure:
            return Result(unit=unit_of(case), status="fail: " + failure)
        first_s = time.perf_counter() - t0
        seconds, reps = time_peer(fn, case, sets, flush, timer, iters)
        result = to_result(case, seconds, ceilings)
        log(f"  {name:15s} {result.median_us:10.1f} us {result.achieved:9.1f} {result.unit} "
            f"({result.pct_of_ceiling:5.1f}%) reps {reps}, first call {first_s:.1f} s")
        return result
    except ContextLost:
        raise
    except Exception as exc:
        assert_context_alive(device)
        return Result(unit=unit_of(case), status="fail: " + short_reason(exc, []))


# ---- output ----------------------------------------------------------------------------------

class RowWriter:
    """Writes rows as they come (flushed) so a crash keeps what was measured."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.writer = csv.writer(stream, lineterminator="\n")
        self.writer.writerow(COLUMNS)

    def _write(self, fields: list) -> None:
        self.writer.writerow(fields)
        self.stream.flush()

    def row(self, case: Case, impl: str, r: Result) -> None:
        self._write([case.family, impl, case.dtype, case.num_qo_heads, case.num_kv_heads,
                     case.head_dim, case.page_size, case.batch, case.qo_len, case.kv_len,
                     case.causal, f"{r.median_us:.2f}", f"{r.achieved:.2f}", r.unit,
                     f"{r.pct_of_ceiling:.1f}", r.status])

    def ceiling(self, impl: str, r: Result) -> None:
        self._write(["ceiling", impl, "bf16", 0, 0, 0, 0, 0, 0, 0, 0, f"{r.median_us:.2f}",
                     f"{r.achieved:.2f}", r.unit, "0.0", r.status])


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fail_all(case: Case, peers: list[str], reason: str, out: RowWriter) -> None:
    for name in peers:
        out.row(case, name, Result(unit=unit_of(case), status="fail: " + reason))


def make_sets(case: Case, device: torch.device) -> tuple[list[Inputs], Optional[torch.Tensor]]:
    return [make_inputs(case, device) for _ in range(num_sets(case))], make_flush(case, device)


def run_case(case: Case, peers: list[str], device: torch.device, timer: Timer, iters: int,
             ceilings: Ceilings, out: RowWriter) -> None:
    """Times every peer on case; raises ContextLost after writing this case's remaining rows."""
    try:
        sets, flush = make_sets(case, device)
    except Exception as exc:
        free_memory()
        assert_context_alive(device)
        fail_all(case, peers, "inputs: " + short_reason(exc, []), out)
        return
    log(f"  {len(sets)} input set(s) of {set_bytes(case) / MB:.1f} MB, "
        f"L2 flush {'on' if flush is not None else 'off'}")
    for i, name in enumerate(peers):
        try:
            result = run_peer(name, case, sets, flush, timer, iters, ceilings)
        except ContextLost as lost:
            fail_all(case, peers[i:], f"CUDA context lost ({lost})", out)
            raise
        if result.status != "ok":
            log(f"  {name:15s} {result.status}")
        out.row(case, name, result)
        free_memory()
    del sets, flush
    free_memory()


def run_sweep(cases: list[Case], peers: list[str], device: torch.device, timer: Timer,
              iters: int, ceilings: Ceilings, out: RowWriter) -> int:
    start = time.perf_counter()
    for i, case in enumerate(cases):
        log(f"[{i + 1}/{len(cases)}] {case.label()} (t={time.perf_counter() - start:.0f} s)")
        try:
            run_case(case, peers, device, timer, iters, ceilings, out)
        except ContextLost as lost:
            log(f"CUDA context lost: {lost}; the remaining rows are failures")
            for rest in cases[i + 1:]:
                fail_all(rest, peers, "CUDA context lost earlier", out)
            return 1
    log(f"done: {len(cases)} configs x {len(peers)} peers in {time.perf_counter() - start:.0f} s")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", type=Path, required=True, help="bench/sweeps/<family>.csv")
    p.add_argument("--csv", type=Path, required=True, help="output CSV")
    p.add_argument("--iters", type=int, default=30, help="timed repetitions (median taken)")
    p.add_argument("--peers", default=",".join(ALL_PEERS),
                   help=f"comma-separated subset of {','.join(ALL_PEERS)}")
    p.add_argument("--ceilings", type=Path,
                   help="CSV with ceiling rows (gqattn-bench); missing ones are measured here")
    p.add_argument("--limit", type=int, default=0, help="only the first N configs (smoke tests)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to smoke-test the script")
    p.add_argument("--settle-ms", type=int, default=0,
                   help="idle ms before each peer's timed calls (as gqattn-bench --settle-ms)")
    args = p.parse_args(argv)
    if args.settle_ms < 0:
        p.error(f"--settle-ms: must be >= 0, got {args.settle_ms}")
    args.peer_list = [s.strip() for s in args.peers.split(",") if s.strip()]
    unknown = sorted(set(args.peer_list) - set(ALL_PEERS))
    if unknown:
        p.error(f"unknown peers {unknown}; known: {ALL_PEERS}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("no CUDA device visible to torch; nothing measured")
        return 2
    cases = read_sweep(args.sweep)[: args.limit or None]
    log(f"torch {torch.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", {len(cases)} configs, peers {args.peer_list}")
    torch.manual_seed(0)
    timer = Timer(device, args.settle_ms)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as stream:
        out = RowWriter(stream)
        have = read_ceilings(args.ceilings) if args.ceilings else Ceilings()
        ceilings = measure_ceilings(timer, have, out)
        log(f"ceilings: read {ceilings.read_gbps:.0f} GB/s, copy {ceilings.copy_gbps:.0f} GB/s, "
            f"gemm {ceilings.gemm_tflops:.0f} TFLOP/s")
        return run_sweep(cases, args.peer_list, device, timer, args.iters, ceilings, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
