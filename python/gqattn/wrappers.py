"""The Python API over gqattn._C: DecodeWrapper / PrefillWrapper (plan once per step, run per layer),
the functional decode / prefill / append_kv / merge_states, page-table helpers and workspaces.
Layer: python/ (pure Python). Tensors are any DLPack producer (torch, numpy, cupy, ...); torch
tensors go through the torch custom ops of gqattn.ops (loaded on first use), the rest call _C.
"""

from __future__ import annotations

import itertools
import math
import operator
import sys
import weakref
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from . import _C

kRecommendedWorkspaceBytes: int = _C.kRecommendedWorkspaceBytes

_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}
_DLPACK_CPU, _DLPACK_CUDA = 1, 2


# ---- small helpers ------------------------------------------------------------------------------

def _torch_module():
    return sys.modules.get("torch")


def _is_torch(x: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


_TORCH_OPS = None


def _torch_ops():
    """gqattn.ops, imported on first use (it imports torch and registers the custom ops)."""
    global _TORCH_OPS
    if _TORCH_OPS is None:
        from . import ops

        _TORCH_OPS = ops
    return _TORCH_OPS


def _load_torch_ops_if_torch_imported() -> None:
    # Plans are made outside compiled regions: registering the ops there keeps run() traceable.
    if _TORCH_OPS is None and _torch_module() is not None:
        _torch_ops()


def _dtype_name(dtype: Any, arg: str = "dtype") -> str:
    """'bf16' / 'fp16' / 'fp32' from a string, a torch dtype or a numpy dtype."""
    key = None
    if isinstance(dtype, str):
        key = dtype
    else:
        torch = _torch_module()
        if torch is not None and isinstance(dtype, torch.dtype):
            key = str(dtype).replace("torch.", "")
        else:
            try:
                import numpy

                key = numpy.dtype(dtype).name
            except (TypeError, ImportError):
                key = None
    name = _DTYPE_ALIASES.get(key.lower()) if key is not None else None
    if name is None:
        raise TypeError(f"{arg}: unsupported dtype {dtype!r} (expected bf16, fp16 or fp32)")
    return name


def _int(value: Any, arg: str, bits: int = 32) -> int:
    """An int (not a bool) that fits in a signed `bits`-bit integer (what the C++ argument holds)."""
    try:
        result = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        result = None
    if result is None:
        raise TypeError(f"{arg}: expected an int, got {type(value).__name__}")
    if not -(1 << (bits - 1)) <= result < 1 << (bits - 1):
        raise ValueError(f"{arg} ({result}) does not fit in int{bits}")
    return result


def _host_rows(values: Any, arg: str, ndim: int, dims: str, what: str) -> list:
    """values (a list, tuple, numpy array or tensor of `ndim` dims, named `dims` in messages) as a
    host list of its rows; TypeError naming `arg` ("expected `what`") when it is not a sequence."""
    got = getattr(values, "ndim", ndim)
    if got != ndim:
        raise ValueError(f"{arg}: expected {dims}, got {got}")
    try:
        return values.tolist() if hasattr(values, "tolist") else list(values)
    except TypeError:
        raise TypeError(f"{arg}: expected {what}, got {type(values).__name__}") from None


def _host_ints(values: Any, arg: str) -> list:
    """A 1-D host list of int32 values from a list, tuple, numpy array or tensor (copied once)."""
    items = _host_rows(values, arg, 1, "1 dim", "a 1-D sequence of ints")
    return [_int(v, f"{arg}[{i}]") for i, v in enumerate(items)]


def _shape(x: Any, arg: str) -> Tuple[int, ...]:
    """x's shape; TypeError naming `arg` when x is not a tensor (as _C says for such an argument)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{arg}: expected a DLPack tensor (torch, numpy, cupy, jax), got {type(x).__name__}")
    return tuple(shape)


def _device_of(x: Any) -> Tuple[str, int]:
    """('cpu', 0) or ('cuda', index) of a DLPack tensor."""
    if _is_torch(x):
        return (x.device.type, x.device.index or 0)
    try:
        kind, index = x.__dlpack_device__()
    except AttributeError:
        return ("cpu", 0)
    return ("cuda" if int(kind) == _DLPACK_CUDA else "cpu" if int(kind) == _DLPACK_CPU else str(kind), int(index))


def _stream_int(stream: Any, device: Tuple[str, int]) -> int:
    """The CUDA stream as an integer: the argument if given, else torch's current stream, else 0."""
    if stream is not None:
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        value = _int(stream, "stream", 64)
        if value < 0:  # a cudaStream_t is an address: the extension takes it unsigned
            raise ValueError(f"stream ({value}) must be >= 0 (a CUDA stream handle, 0 the default stream)")
        return value
    if device[0] != "cuda":
        return 0
    torch = _torch_module()
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_stream(device[1]).cuda_stream
    return 0


def _export(x: Any) -> Any:
    """What _C receives: a torch tensor as a DLPack capsule (no stream sync, see gqattn.ops._dl),
    anything else as it is."""
    if _is_torch(x):
        return _torch_module().utils.dlpack.to_dlpack(x)
    return x


def _empty(like: Any, shape: Sequence[int], float32: bool = False) -> Any:
    """An uninitialised array of `shape` on `like`'s device, of its dtype (or fp32), of its kind."""
    torch = _torch_module()
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(tuple(shape), dtype=torch.float32 if float32 else like.dtype, device=like.device)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(like, numpy.ndarray):  # numpy < 2 has no __array_namespace__
        return numpy.empty(tuple(shape), dtype=numpy.float32 if float32 else like.dtype)
    if hasattr(like, "__array_namespace__"):
        xp = like.__array_namespace__()
        dtype = xp.float32 if float32 else like.dtype
        try:
            return xp.empty(tuple(shape), dtype=dtype, device=like.device)
        except TypeError:
            return xp.empty(tuple(shape), dtype=dtype)
    raise TypeError(f"cannot allocate an output like a {type(like).__name__}: pass out= (and lse=)")


def _outputs(q: Any, out: Any, lse: Any, want_lse: bool) -> Tuple[Any, Any]:
    """out (like q) and, when wanted, lse (fp32 [tokens, num_qo_heads]): the given ones or new ones."""
    if out is None:
        out = _empty(q, _shape(q, "q"))
    if want_lse and lse is None:
        lse = _empty(q, _shape(q, "q")[:2], float32=True)
    return out, lse


# The smallest magnitude float32 rounds to inf: the largest finite float32 plus half its ulp.
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def _sm_scale(sm_scale: Optional[float]) -> float:
    if sm_scale is None:
        return 0.0
    # float() would parse "0.5" and take True as 1.
    if isinstance(sm_scale, (str, bytes, bool)):
        raise TypeError(f"sm_scale: expected a float, got {type(sm_scale).__name__}")
    try:
        value = float(sm_scale)
    except (TypeError, ValueError):
        raise TypeError(f"sm_scale: expected a float, got {type(sm_scale).__name__}") from None
    if math.isfinite(value) and abs(value) >= _FLOAT32_OVERFLOW:
        raise ValueError(f"sm_scale ({value}) is past the float32 range (it would round to inf)")
    if value == 0.0:
        raise ValueError("sm_scale (0) must be nonzero (None means 1/sqrt(head_dim))")
    # The library takes a float32, where 0 means the default: a value that rounds to 0 there is an error.
    if abs(value) <= 2.0**-150:  # half the smallest float32 subnormal, which rounds to even 0
        raise ValueError(f"sm_scale ({value}) rounds to 0 in float32 (None means 1/sqrt(head_dim))")
    return value


def _checked_pages(kv_page_indices: Any, num_pages: Any) -> Tuple[List[int], int]:
    """Checked mode's page ids and pool size for _C.*_plan: ([], -1) when neither is given. The two
    come together: the library takes an empty list of ids without a pool size as unchecked, and a
    pool size without ids as checked mode with no pages."""
    if kv_page_indices is None:
        if num_pages is not None:
            raise ValueError("kv_page_indices: must be given with num_pages (checked mode)")
        return [], -1
    if num_pages is None:
        raise ValueError("num_pages: must be given with kv_page_indices (checked mode)")
    return _host_ints(kv_page_indices, "kv_page_indices"), _int(num_pages, "num_pages", 64)


def _check_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout: unknown {kv_layout!r} (expected 'NHD' or 'HND')")
    return kv_layout


def make_workspace(device: Any = "cuda", nbytes: int = kRecommendedWorkspaceBytes) -> Any:
    """A uint8 workspace of `nbytes` on `device` ('cpu', 'cuda', 'cuda:1' or a torch.device).

    A torch tensor when torch is importable, else (CPU only) a numpy array. The CPU backend does not
    use the workspace's memory, only its device."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        return torch.empty(nbytes, dtype=torch.uint8, device=torch.device(device))
    if str(device) != "cpu":
        raise ValueError(f"device: {device!r} needs torch to allocate a CUDA workspace (or pass your own)")
    import numpy

    return numpy.empty(nbytes, dtype=numpy.uint8)


# ---- plans: host objects behind integer handles ---------------------------------------------------
# Each wrapper owns one handle, stable across its re-plans; the torch ops take the handle, so a graph
# captured or compiled with one plan runs with the wrapper's latest plan.

class _PlanEntry(NamedTuple):
    plan: Any  # _C.Plan
    kv_layout: str
    workspace: Any  # kept alive with the plan: the plan points into it


_PLANS: dict = {}
_HANDLES = itertools.count(1)


def _plan_entry(handle: int) -> _PlanEntry:
    entry = _PLANS.get(handle)
    if entry is None:
        raise ValueError(f"plan: handle {handle} has no plan (call plan() before run())")
    return entry


class _Wrapper:
    def __init__(self, workspace: Any = None) -> None:
        self._workspace = workspace
        self._handle = next(_HANDLES)
        self._finalizer = weakref.finalize(self, _PLANS.pop, self._handle, None)
        self._kv_layout = "NHD"
        _load_torch_ops_if_torch_imported()

    @property
    def plan_info(self) -> Any:
        """The current plan (gqattn._C.Plan): kernel choice, split-KV, lengths."""
        return _plan_entry(self._handle).plan

    @property
    def handle(self) -> int:
        """The integer the torch ops use to find this wrapper's plan."""
        return self._handle

    def _plan_stream(self, stream: Any) -> int:
        return _stream_int(stream, _device_of(self._workspace) if self._workspace is not None else ("cpu", 0))

    def _store(self, plan: Any, kv_layout: str) -> None:
        _load_torch_ops_if_torch_imported()
        _PLANS[self._handle] = _PlanEntry(plan, kv_layout, self._workspace)
        self._kv_layout = kv_layout


class DecodeWrapper(_Wrapper):
    """Batch decode over a paged KV cache (FlashInfer's BatchDecodeWithPagedKVCacheWrapper).

    `workspace`: a uint8 tensor (make_workspace) whose device picks the backend; None plans for the
    CPU. plan() runs once per step on the host; run() runs once per layer, allocates nothing but
    `out` (and lse) when not given, and never synchronises, so it can be captured in a CUDA graph.
    """

    def plan(
        self,
        kv_page_indptr: Any,
        kv_last_page_len: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        qo_len: int = 1,
        dtype: Any = "bf16",
        kv_layout: str = "NHD",
        enable_cuda_graph: bool = False,
        max_num_splits: int = 0,
        kv_page_indices: Any = None,
        num_pages: Optional[int] = None,
        stream: Any = None,
        graph_per_split: bool = False,
        fixed_split_size: int = 0,
    ) -> None:
        """Plans a decode step. kv_page_indptr [batch + 1] and kv_last_page_len [batch] are host
        lists/arrays or tensors (copied to the host once). Every request has qo_len new tokens.
        Checked mode: pass kv_page_indices and num_pages to check every page id against the pool.
        enable_cuda_graph: a graph captured with one plan's run() replays correctly after plan()
        with other lengths (same workspace, batch and qo_len). graph_per_split (with
        enable_cuda_graph): run() launches the split-KV merge only when the plan split
        (plan_info.split), so keep one graph per value of plan_info.split. fixed_split_size: split-KV
        in chunks of that many keys (rounded up to the kernel's key tile; 0: the planner decides;
        not with max_num_splits), as FlashInfer's fixed_split_size but counted in keys."""
        kv_layout = _check_layout(kv_layout)  # before planning: a CUDA plan overwrites the workspace
        page_ids, pool_pages = _checked_pages(kv_page_indices, num_pages)
        plan = _C.decode_plan(
            _export(self._workspace),
            _host_ints(kv_page_indptr, "kv_page_indptr"),
            _host_ints(kv_last_page_len, "kv_last_page_len"),
            _int(num_qo_heads, "num_qo_heads"),
            _int(num_kv_heads, "num_kv_heads"),
            _int(head_dim, "head_dim"),
            _int(page_size, "page_size"),
            qo_len=_int(qo_len, "qo_len"),
            dtype=_dtype_name(dtype),
            enable_cuda_graph=bool(enable_cuda_graph),
            max_num_splits=_int(max_num_splits, "max_num_splits"),
            kv_page_indices=page_ids,
            num_pages=pool_pages,
            stream=self._plan_stream(stream),
            graph_per_split=bool(graph_per_split),
            fixed_split_size=_int(fixed_split_size, "fixed_split_size"),
        )
        self._store(plan, kv_layout)

    def run(
        self,
        q: Any,
        k_pages: Any,
        v_pages: Any,
        kv_page_indptr: Any,
        kv_page_indices: Any,
        kv_last_page_len: Any,
        out: Any = None,
        return_lse: bool = False,
        sm_scale: Optional[float] = None,
        lse: Any = None,
        stream: Any = None,
    ) -> Any:
        """q [batch * qo_len, num_qo_heads, head_dim]; k_pages / v_pages in the plan's kv_layout
        (NHD [num_pages, page_size, num_kv_heads, head_dim], HND [num_pages, num_kv_heads,
        page_size, head_dim]); int32 index tensors on q's device. Returns out, or (out, lse) with
        return_lse (lse fp32 [tokens, num_qo_heads], natural log). sm_scale None: 1/sqrt(head_dim).
        Torch tensors run on the current CUDA stream (`stream` overrides it, bypassing the op)."""
        scale = _sm_scale(sm_scale)
        want_lse = bool(return_lse) or lse is not None
        if stream is None and _is_torch(q):
            out, lse = _torch_ops().decode(
                self._handle, q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len,
                out, lse, want_lse, scale)
        else:
            entry = _plan_entry(self._handle)
            out, lse = _outputs(q, out, lse, want_lse)
            _C.decode_run(entry.plan, *map(_export, (q, k_pages, v_pages, kv_page_indptr, kv_page_indices,
                                                      kv_last_page_len, out, lse)),
                          kv_layout=entry.kv_layout, sm_scale=scale, stream=_stream_int(stream, _device_of(q)))
        return (out, lse) if return_lse else out


class PrefillWrapper(_Wrapper):
    """Batch prefill (varlen queries) over paged or ragged K/V (FlashInfer's
    BatchPrefillWith{Paged,Ragged}KVCacheWrapper in one). Same plan/run contract as DecodeWrapper."""

    def __init__(self, workspace: Any = None) -> None:
        super().__init__(workspace)
        self._paged = False
        self._causal = False

    def plan(
        self,
        qo_indptr: Any,
        kv_indptr: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 0,
        kv_last_page_len: Any = None,
        causal: bool = False,
        dtype: Any = "bf16",
        kv_layout: str = "NHD",
        enable_cuda_graph: bool = False,
        max_num_splits: int = 0,
        kv_page_indices: Any = None,
        num_pages: Optional[int] = None,
        stream: Any = None,
        graph_per_split: bool = False,
        fixed_split_size: int = 0,
    ) -> None:
        """Plans a prefill batch. qo_indptr [batch + 1] query row offsets. Paged K/V (page_size >= 1):
        kv_indptr is the page indptr and kv_last_page_len is required. Ragged K/V (page_size 0):
        kv_indptr is the token indptr. causal: aligned to the end of each request's KV (query i of
        qo_len sees keys 0 .. kv_len - qo_len + i), as for chunked prefill and prefix caching.
        enable_cuda_graph and graph_per_split: as for DecodeWrapper.plan, with the same query rows
        (qo_indptr) in place of the same batch and qo_len: other query rows need a new capture.
        fixed_split_size: as for DecodeWrapper.plan."""
        page_size = _int(page_size, "page_size")
        paged = page_size >= 1
        if paged and kv_last_page_len is None:
            raise ValueError("kv_last_page_len: required for paged K/V (page_size >= 1)")
        kv_layout = _check_layout(kv_layout)  # before planning: a CUDA plan overwrites the workspace
        page_ids, pool_pages = _checked_pages(kv_page_indices, num_pages)
        plan = _C.prefill_plan(
            _export(self._workspace),
            _host_ints(qo_indptr, "qo_indptr"),
            _host_ints(kv_indptr, "kv_indptr"),
            _host_ints(kv_last_page_len, "kv_last_page_len") if kv_last_page_len is not None else [],
            _int(num_qo_heads, "num_qo_heads"),
            _int(num_kv_heads, "num_kv_heads"),
            _int(head_dim, "head_dim"),
            page_size,
            causal=bool(causal),
            dtype=_dtype_name(dtype),
            enable_cuda_graph=bool(enable_cuda_graph),
            max_num_splits=_int(max_num_splits, "max_num_splits"),
            kv_page_indices=page_ids,
            num_pages=pool_pages,
            stream=self._plan_stream(stream),
            graph_per_split=bool(graph_per_split),
            fixed_split_size=_int(fixed_split_size, "fixed_split_size"),
        )
        self._paged = paged
        self._causal = bool(causal)
        self._store(plan, kv_layout)

    def run(
        self,
        q: Any,
        k: Any,
        v: Any,
        qo_indptr: Any,
        kv_indptr: Any,
        kv_page_indices: Any = None,
        kv_last_page_len: Any = None,
        out: Any = None,
        return_lse: bool = False,
        sm_scale: Optional[float] = None,
        lse: Any = None,
        stream: Any = None,
    ) -> Any:
        """q [qo_indptr[-1], num_qo_heads, head_dim]; qo_indptr int32 on q's device. Paged plan: k, v
        are page pools in the plan's kv_layout with kv_indptr (pages), kv_page_indices and
        kv_last_page_len. Ragged plan: k, v are [kv_tokens, num_kv_heads, head_dim] with kv_indptr
        (tokens). Returns out, or (out, lse) with return_lse."""
        scale = _sm_scale(sm_scale)
        want_lse = bool(return_lse) or lse is not None
        if self._paged and (kv_page_indices is None or kv_last_page_len is None):
            raise ValueError("kv_page_indices, kv_last_page_len: required, the plan is for paged K/V")
        if not self._paged and (kv_page_indices is not None or kv_last_page_len is not None):
            raise ValueError("kv_page_indices, kv_last_page_len: the plan is for ragged K/V (page_size 0); leave them out")
        if stream is None and _is_torch(q):
            ops = _torch_ops()
            if self._paged:
                out, lse = ops.prefill_paged(
                    self._handle, q, qo_indptr, k, v, kv_indptr, kv_page_indices, kv_last_page_len,
                    out, lse, want_lse, self._causal, scale)
            else:
                out, lse = ops.prefill_ragged(
                    self._handle, q, qo_indptr, k, v, kv_indptr, out, lse, want_lse, self._causal, scale)
        else:
            entry = _plan_entry(self._handle)
            out, lse = _outputs(q, out, lse, want_lse)
            s = _stream_int(stream, _device_of(q))
            if self._paged:
                _C.prefill_run_paged(entry.plan, *map(_export, (q, qo_indptr, k, v, kv_indptr, kv_page_indices,
                                                                 kv_last_page_len, out, lse)),
                                     causal=self._causal, kv_layout=entry.kv_layout, sm_scale=scale, stream=s)
            else:
                _C.prefill_run_ragged(entry.plan, *map(_export, (q, qo_indptr, k, v, kv_indptr, out, lse)),
                                      causal=self._causal, sm_scale=scale, stream=s)
        return (out, lse) if return_lse else out


# ---- functional API --------------------------------------------------------------------------------

def _workspace_for(x: Any) -> Any:
    device = _device_of(x)
    if device[0] == "cpu":
        return None
    if device[0] != "cuda":
        raise ValueError(f"q: is on {device[0]}; gqattn runs on cpu or cuda tensors")
    return make_workspace(f"cuda:{device[1]}")


def _release_after(workspace: Any, stream: Any) -> None:
    """A functional call's temporary torch workspace is freed when the call returns. On the current
    stream that is safe (torch's allocator orders reuse on it); with an explicit `stream`, record
    that stream on the workspace so the allocator waits for the kernels still reading it."""
    torch = _torch_module()
    if stream is None or torch is None or not isinstance(workspace, torch.Tensor) or not workspace.is_cuda:
        return
    ptr = _stream_int(stream, _device_of(workspace))
    workspace.record_stream(torch.cuda.ExternalStream(ptr, device=workspace.device))


def _pool_dims(k_pages: Any, kv_layout: str, arg: str) -> Tuple[int, int]:
    shape = _shape(k_pages, arg)
    if len(shape) != 4:
        raise ValueError(f"{arg}: expected 4 dims (a page pool in layout {kv_layout}), got {list(shape)}")
    return (shape[2], shape[1]) if kv_layout == "NHD" else (shape[1], shape[2])  # (num_kv_heads, page_size)


def _qo_dims(q: Any) -> Tuple[int, int, int]:
    shape = _shape(q, "q")
    if len(shape) != 3:
        raise ValueError(f"q: expected 3 dims [tokens, num_qo_heads, head_dim], got {list(shape)}")
    return shape


def decode(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    kv_page_indptr: Any,
    kv_page_indices: Any,
    kv_last_page_len: Any,
    kv_layout: str = "NHD",
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Plan + run of one decode in a call (allocates a workspace on the GPU; copies the indptr and
    last-page lengths to the host). qo_len = q.shape[0] / batch. See DecodeWrapper for shapes."""
    kv_layout = _check_layout(kv_layout)
    tokens, num_qo_heads, head_dim = _qo_dims(q)
    num_kv_heads, page_size = _pool_dims(k_pages, kv_layout, "k_pages")
    indptr = _host_ints(kv_page_indptr, "kv_page_indptr")
    batch = max(len(indptr) - 1, 0)
    if batch == 0 and tokens != 0:
        raise ValueError(f"q: {tokens} tokens but kv_page_indptr holds no request")
    if batch > 0 and tokens % batch != 0:
        raise ValueError(f"q: {tokens} tokens are not a whole number of tokens for each of {batch} requests")
    workspace = _workspace_for(q)
    wrapper = DecodeWrapper(workspace)
    wrapper.plan(indptr, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 qo_len=tokens // batch if batch > 0 else 1, dtype=_tensor_dtype(q), kv_layout=kv_layout, stream=stream)
    result = wrapper.run(q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, out=out,
                         return_lse=return_lse, sm_scale=sm_scale, stream=stream)
    _release_after(workspace, stream)
    return result


def prefill(
    q: Any,
    k: Any,
    v: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_page_indices: Any = None,
    kv_last_page_len: Any = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Plan + run of one prefill in a call. Paged when kv_page_indices is given (k, v page pools,
    kv_indptr the page indptr, kv_last_page_len required), else ragged (k, v [kv_tokens,
    num_kv_heads, head_dim], kv_indptr the token indptr). See PrefillWrapper."""
    kv_layout = _check_layout(kv_layout)
    _, num_qo_heads, head_dim = _qo_dims(q)
    paged = kv_page_indices is not None
    if paged:
        num_kv_heads, page_size = _pool_dims(k, kv_layout, "k")
    else:
        shape = _shape(k, "k")
        if len(shape) != 3:
            raise ValueError(f"k: expected 3 dims [kv_tokens, num_kv_heads, head_dim] (ragged), got {list(shape)}")
        num_kv_heads, page_size = shape[1], 0
    workspace = _workspace_for(q)
    wrapper = PrefillWrapper(workspace)
    wrapper.plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, page_size=page_size,
                 kv_last_page_len=kv_last_page_len, causal=causal, dtype=_tensor_dtype(q), kv_layout=kv_layout,
                 stream=stream)
    result = wrapper.run(q, k, v, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len, out=out,
                         return_lse=return_lse, sm_scale=sm_scale, stream=stream)
    _release_after(workspace, stream)
    return result


def _tensor_dtype(x: Any) -> str:
    return _dtype_name(getattr(x, "dtype", None), "q")


def append_kv(
    k_new: Any,
    v_new: Any,
    batch_indices: Any,
    positions: Any,
    k_pages: Any,
    v_pages: Any,
    kv_page_indptr: Any,
    kv_page_indices: Any,
    kv_last_page_len: Any = None,
    kv_layout: str = "NHD",
    stream: Any = None,
) -> None:
    """Writes new tokens' K/V ([num_tokens, num_kv_heads, head_dim]) into their page slots: token t
    of request batch_indices[t] at position positions[t] goes to page
    kv_page_indices[kv_page_indptr[b] + pos // page_size], row pos % page_size. On the CPU every
    index is checked first; on the GPU out-of-range tokens are skipped."""
    kv_layout = _check_layout(kv_layout)
    if stream is None and _is_torch(k_pages):
        _torch_ops().append(k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, k_new, v_new,
                            batch_indices, positions, kv_layout)
        return
    _C.append_kv(*map(_export, (k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, k_new, v_new,
                                batch_indices, positions)),
                 kv_layout=kv_layout, stream=_stream_int(stream, _device_of(k_pages)))


def merge_states(v: Any, s: Any, v_merged: Any = None, s_merged: Any = None, stream: Any = None) -> Tuple[Any, Any]:
    """Merges partial attention states over disjoint key sets: v [n, num_states, num_heads, head_dim],
    s fp32 [n, num_states, num_heads] (natural-log LSE, -inf for an empty state). Returns (v_merged
    [n, num_heads, head_dim] of v's dtype, s_merged fp32 [n, num_heads])."""
    shape = _shape(v, "v")
    if len(shape) != 4:
        raise ValueError(f"v: expected 4 dims [n, num_states, num_heads, head_dim], got {list(shape)}")
    if stream is None and _is_torch(v):
        return _torch_ops().merge(v, s, v_merged, s_merged)
    if v_merged is None:
        v_merged = _empty(v, (shape[0], shape[2], shape[3]))
    if s_merged is None:
        s_merged = _empty(v, (shape[0], shape[2]), float32=True)
    _C.merge_states(*map(_export, (v, s, v_merged, s_merged)), stream=_stream_int(stream, _device_of(v)))
    return v_merged, s_merged


# ---- page tables ---------------------------------------------------------------------------------

def _index_array(values: list, like: Any, shape: Optional[Tuple[int, ...]] = None) -> Any:
    """int32 array of `values` of like's kind (torch on like's device, else numpy)."""
    if _is_torch(like):
        torch = _torch_module()
        t = torch.tensor(values, dtype=torch.int32, device=like.device)
        return t.reshape(shape) if shape is not None else t
    import numpy

    a = numpy.asarray(values, dtype=numpy.int32)
    return a.reshape(shape) if shape is not None else a


def block_table_to_csr(block_table: Any, kv_len: Any, page_size: int) -> Tuple[Any, Any, Any]:
    """Padded block table [batch, max_pages] (row b lists request b's pages) and kv_len [batch] ->
    (kv_page_indptr, kv_page_indices, kv_last_page_len), int32 arrays of block_table's kind."""
    rows = _host_rows(block_table, "block_table", 2, "2 dims [batch, max_pages]", "a 2-D table of ints")
    rows = [_host_ints(row, f"block_table[{b}]") for b, row in enumerate(rows)]
    batch = len(rows)
    max_pages = len(rows[0]) if batch else 0
    flat = []
    for b, row in enumerate(rows):
        if len(row) != max_pages:
            raise ValueError(f"block_table: row {b} holds {len(row)} pages, row 0 holds {max_pages}")
        flat.extend(row)
    indptr, indices, last = _C.block_table_to_csr(flat, batch, max_pages, _host_ints(kv_len, "kv_len"),
                                                  _int(page_size, "page_size"))
    return _index_array(indptr, block_table), _index_array(indices, block_table), _index_array(last, block_table)


def csr_to_block_table(kv_page_indptr: Any, kv_page_indices: Any, kv_last_page_len: Any,
                       page_size: int) -> Tuple[Any, Any]:
    """CSR page table -> (block_table int32 [batch, max_pages], kv_len int32 [batch]), of
    kv_page_indptr's kind."""
    pages, batch, max_pages, kv_len = _C.csr_to_block_table(
        _host_ints(kv_page_indptr, "kv_page_indptr"), _host_ints(kv_page_indices, "kv_page_indices"),
        _host_ints(kv_last_page_len, "kv_last_page_len"), _int(page_size, "page_size"))
    return _index_array(pages, kv_page_indptr, (batch, max_pages)), _index_array(kv_len, kv_page_indptr)


def build_info() -> dict:
    """What this build compiled: {'cuda': bool, 'head_dims': [...], 'dtypes': [...], 'cuda_archs': [...]}."""
    return _C.build_info()


def cuda_device_count() -> int:
    """Usable CUDA devices (0 when built without CUDA or none present)."""
    return _C.cuda_device_count()
