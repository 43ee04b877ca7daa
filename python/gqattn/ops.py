"""torch custom ops (namespace gqattn) over gqattn._C, with fake implementations, so that calls
work under torch.compile(fullgraph=True) and inside captured CUDA graphs.
Layer: python/ (imported by the wrappers on first use with torch tensors; importing it imports torch).

Plans stay on the host, outside any graph: an op takes the integer handle of a DecodeWrapper or
PrefillWrapper (`wrapper.handle`) and runs that wrapper's latest plan. The handle never changes
when the wrapper re-plans, so a compiled function does not recompile and a captured graph replays
the new plan (plan with enable_cuda_graph=True, same workspace and query rows: batch and qo_len
for decode, qo_indptr for prefill). Each op writes
its outputs in place (`out`, `lse`, the pools for append_kv), runs on the current CUDA stream and
allocates nothing.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.utils.dlpack import to_dlpack

from . import _C
from .wrappers import _outputs, _plan_entry

Tensor = torch.Tensor


def _dl(t: Optional[Tensor]):
    """A DLPack capsule of t. Unlike Tensor.__dlpack__(), to_dlpack never makes another stream wait
    (which would break CUDA-graph capture) and accepts tensors that require grad."""
    return None if t is None else to_dlpack(t)


def _launch(device: torch.device, fn, *args, **kwargs) -> None:
    """Calls fn with stream= the current stream of `device` (0 on the CPU), that device current."""
    if device.type != "cuda":
        fn(*args, stream=0, **kwargs)
        return
    with torch.cuda.device(device):
        fn(*args, stream=torch.cuda.current_stream(device).cuda_stream, **kwargs)


@torch.library.custom_op("gqattn::decode_run", mutates_args=("out", "lse"))
def decode_run(
    plan_handle: int,
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    kv_page_indptr: Tensor,
    kv_page_indices: Tensor,
    kv_last_page_len: Tensor,
    out: Tensor,
    lse: Optional[Tensor],
    sm_scale: float,
) -> None:
    """DecodeWrapper.run: writes out [tokens, num_qo_heads, head_dim] and lse (optional)."""
    entry = _plan_entry(plan_handle)
    _launch(q.device, _C.decode_run, entry.plan, _dl(q), _dl(k_pages), _dl(v_pages), _dl(kv_page_indptr),
            _dl(kv_page_indices), _dl(kv_last_page_len), _dl(out), _dl(lse),
            kv_layout=entry.kv_layout, sm_scale=sm_scale)


@decode_run.register_fake
def _(plan_handle, q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, out, lse, sm_scale):
    return None


@torch.library.custom_op("gqattn::prefill_run_paged", mutates_args=("out", "lse"))
def prefill_run_paged(
    plan_handle: int,
    q: Tensor,
    qo_indptr: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    kv_page_indptr: Tensor,
    kv_page_indices: Tensor,
    kv_last_page_len: Tensor,
    out: Tensor,
    lse: Optional[Tensor],
    causal: bool,
    sm_scale: float,
) -> None:
    """PrefillWrapper.run with paged K/V."""
    entry = _plan_entry(plan_handle)
    _launch(q.device, _C.prefill_run_paged, entry.plan, _dl(q), _dl(qo_indptr), _dl(k_pages), _dl(v_pages),
            _dl(kv_page_indptr), _dl(kv_page_indices), _dl(kv_last_page_len), _dl(out), _dl(lse),
            causal=causal, kv_layout=entry.kv_layout, sm_scale=sm_scale)


@prefill_run_paged.register_fake
def _(plan_handle, q, qo_indptr, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, out, lse,
      causal, sm_scale):
    return None


@torch.library.custom_op("gqattn::prefill_run_ragged", mutates_args=("out", "lse"))
def prefill_run_ragged(
    plan_handle: int,
    q: Tensor,
    qo_indptr: Tensor,
    k: Tensor,
    v: Tensor,
    kv_indptr: Tensor,
    out: Tensor,
    lse: Optional[Tensor],
    causal: bool,
    sm_scale: float,
) -> None:
    """PrefillWrapper.run with ragged K/V."""
    entry = _plan_entry(plan_handle)
    _launch(q.device, _C.prefill_run_ragged, entry.plan, _dl(q), _dl(qo_indptr), _dl(k), _dl(v),
            _dl(kv_indptr), _dl(out), _dl(lse), causal=causal, sm_scale=sm_scale)


@prefill_run_ragged.register_fake
def _(plan_handle, q, qo_indptr, k, v, kv_indptr, out, lse, causal, sm_scale):
    return None


@torch.library.custom_op("gqattn::append_kv", mutates_args=("k_pages", "v_pages"))
def append_kv(
    k_pages: Tensor,
    v_pages: Tensor,
    kv_page_indptr: Tensor,
    kv_page_indices: Tensor,
    kv_last_page_len: Optional[Tensor],
    k_new: Tensor,
    v_new: Tensor,
    batch_indices: Tensor,
    positions: Tensor,
    kv_layout: str,
) -> None:
    """gqattn.append_kv: writes k_new / v_new into their page slots."""
    _launch(k_pages.device, _C.append_kv, _dl(k_pages), _dl(v_pages), _dl(kv_page_indptr), _dl(kv_page_indices),
            _dl(kv_last_page_len), _dl(k_new), _dl(v_new), _dl(batch_indices), _dl(positions), kv_layout=kv_layout)


@append_kv.register_fake
def _(k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, k_new, v_new, batch_indices, positions,
      kv_layout):
    return None


@torch.library.custom_op("gqattn::merge_states", mutates_args=("v_merged", "s_merged"))
def merge_states(v: Tensor, s: Tensor, v_merged: Tensor, s_merged: Optional[Tensor]) -> None:
    """gqattn.merge_states into v_merged (and s_merged)."""
    _launch(v.device, _C.merge_states, _dl(v), _dl(s), _dl(v_merged), _dl(s_merged))


@merge_states.register_fake
def _(v, s, v_merged, s_merged):
    return None


# ---- what the wrappers call with torch tensors: allocate missing outputs, then the op -----------

def _require(**tensors) -> None:
    """TypeError naming the first argument that is not a torch tensor (None allowed for lse / out)."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor) and not (t is None and name in ("out", "lse", "kv_last_page_len",
                                                                     "v_merged", "s_merged")):
            raise TypeError(f"{name}: expected a torch.Tensor (the other arguments are torch tensors), "
                            f"got {type(t).__name__}")
    # One device type: torch sends a call with any meta tensor to the fake implementation, which
    # computes and checks nothing (the library checks cpu against cuda, and device indices, itself).
    given = [(name, t) for name, t in tensors.items() if t is not None]
    ref_name, ref = given[0]
    for name, t in given[1:]:
        if t.device.type != ref.device.type:
            raise ValueError(f"{name}: is on {t.device}, {ref_name} is on {ref.device}")


def decode(handle: int, q: Tensor, k_pages: Tensor, v_pages: Tensor, kv_page_indptr: Tensor,
           kv_page_indices: Tensor, kv_last_page_len: Tensor, out: Optional[Tensor], lse: Optional[Tensor],
           want_lse: bool, sm_scale: float) -> Tuple[Tensor, Optional[Tensor]]:
    _require(q=q, k_pages=k_pages, v_pages=v_pages, kv_page_indptr=kv_page_indptr, kv_page_indices=kv_page_indices,
             kv_last_page_len=kv_last_page_len, out=out, lse=lse)
    out, lse = _outputs(q, out, lse, want_lse)
    torch.ops.gqattn.decode_run(handle, q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len,
                                out, lse, sm_scale)
    return out, lse


def prefill_paged(handle: int, q: Tensor, qo_indptr: Tensor, k_pages: Tensor, v_pages: Tensor,
                  kv_page_indptr: Tensor, kv_page_indices: Tensor, kv_last_page_len: Tensor,
                  out: Optional[Tensor], lse: Optional[Tensor], want_lse: bool, causal: bool,
                  sm_scale: float) -> Tuple[Tensor, Optional[Tensor]]:
    _require(q=q, qo_indptr=qo_indptr, k=k_pages, v=v_pages, kv_indptr=kv_page_indptr,
             kv_page_indices=kv_page_indices, kv_last_page_len=kv_last_page_len, out=out, lse=lse)
    out, lse = _outputs(q, out, lse, want_lse)
    torch.ops.gqattn.prefill_run_paged(handle, q, qo_indptr, k_pages, v_pages, kv_page_indptr, kv_page_indices,
                                       kv_last_page_len, out, lse, causal, sm_scale)
    return out, lse


def prefill_ragged(handle: int, q: Tensor, qo_indptr: Tensor, k: Tensor, v: Tensor, kv_indptr: Tensor,
                   out: Optional[Tensor], lse: Optional[Tensor], want_lse: bool, causal: bool,
                   sm_scale: float) -> Tuple[Tensor, Optional[Tensor]]:
    _require(q=q, qo_indptr=qo_indptr, k=k, v=v, kv_indptr=kv_indptr, out=out, lse=lse)
    out, lse = _outputs(q, out, lse, want_lse)
    torch.ops.gqattn.prefill_run_ragged(handle, q, qo_indptr, k, v, kv_indptr, out, lse, causal, sm_scale)
    return out, lse


def append(k_pages: Tensor, v_pages: Tensor, kv_page_indptr: Tensor, kv_page_indices: Tensor,
           kv_last_page_len: Optional[Tensor], k_new: Tensor, v_new: Tensor, batch_indices: Tensor,
           positions: Tensor, kv_layout: str) -> None:
    _require(k_pages=k_pages, v_pages=v_pages, kv_page_indptr=kv_page_indptr, kv_page_indices=kv_page_indices,
             kv_last_page_len=kv_last_page_len, k_new=k_new, v_new=v_new, batch_indices=batch_indices,
             positions=positions)
    torch.ops.gqattn.append_kv(k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len, k_new, v_new,
                               batch_indices, positions, kv_layout)


def merge(v: Tensor, s: Tensor, v_merged: Optional[Tensor], s_merged: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    _require(v=v, s=s, v_merged=v_merged, s_merged=s_merged)
    if v_merged is None:
        v_merged = torch.empty((v.shape[0], v.shape[2], v.shape[3]), dtype=v.dtype, device=v.device)
    if s_merged is None:
        s_merged = torch.empty((v.shape[0], v.shape[2]), dtype=torch.float32, device=v.device)
    torch.ops.gqattn.merge_states(v, s, v_merged, s_merged)
    return v_merged, s_merged
