"""Test helpers for the pytest suite: a float64 numpy attention reference (GQA head mapping, causal
mask aligned to the end of the KV, LSE), random paged caches over a larger pool (NHD / HND), and a
fake DLPack tensor that claims to live on a CUDA device (for device-mismatch checks without a GPU).
Layer: tests/python (imported by the test modules; needs numpy only).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import numpy as np


def attention_ref(q, k, v, causal, sm_scale=None):
    """q [qo_len, Hq, D], k / v [kv_len, Hkv, D] (any float dtype) -> float64 (o [qo_len, Hq, D],
    lse [qo_len, Hq]). Query head h reads K/V head h // (Hq // Hkv). With causal, query i sees keys
    0 .. kv_len - qo_len + i. A row that sees no key gives o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    qo_len, num_qo_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_qo_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    logits = np.einsum("qhd,khd->hqk", q, kk) * scale
    if causal:
        visible = np.arange(kv_len)[None, :] <= (kv_len - qo_len + np.arange(qo_len))[:, None]
        logits = np.where(visible[None], logits, -np.inf)
    o = np.zeros((qo_len, num_qo_heads, head_dim))
    lse = np.full((qo_len, num_qo_heads), -np.inf)
    if kv_len == 0:
        return o, lse
    m = logits.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.where(seen, np.exp(logits - np.where(seen, m, 0.0)), 0.0)
    s = p.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        o_h = np.einsum("hqk,khd->hqd", p, vv) / np.where(s > 0, s, 1.0)[..., None]
        lse_h = np.where(s > 0, m[..., 0] + np.log(np.where(s > 0, s, 1.0)), -np.inf)
    return np.transpose(o_h, (1, 0, 2)), lse_h.T


def round_to(x, dtype):
    """x stored in dtype (numpy fp16 / fp32), returned as that dtype."""
    return np.asarray(x).astype(dtype)


@dataclass
class PagedCache:
    """A batch's K/V in pages of a pool larger than needed, with a random page table."""

    k_pages: np.ndarray
    v_pages: np.ndarray
    kv_page_indptr: np.ndarray
    kv_page_indices: np.ndarray
    kv_last_page_len: np.ndarray
    k: list = field(default_factory=list)  # per request [kv_len, Hkv, D], in the pool's dtype
    v: list = field(default_factory=list)


def make_paged(rng, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype, spare_pages=7):
    """Random K/V for each request written into a random subset of a pool's pages; the unused slots
    hold large finite garbage so that a read outside a request's keys shows up."""
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + spare_pages
    order = rng.permutation(num_pages)
    if layout == "NHD":
        shape = (num_pages, page_size, num_kv_heads, head_dim)
    else:
        shape = (num_pages, num_kv_heads, page_size, head_dim)
    k_pages = (rng.standard_normal(shape) * 100).astype(dtype)
    v_pages = (rng.standard_normal(shape) * 100).astype(dtype)
    indptr = [0]
    indices = []
    last = []
    ks, vs = [], []
    used = 0
    for n, p in zip(kv_lens, pages):
        ids = order[used:used + p]
        used += p
        indices.extend(int(i) for i in ids)
        indptr.append(len(indices))
        last.append(0 if p == 0 else n - (p - 1) * page_size)
        k = rng.standard_normal((n, num_kv_heads, head_dim)).astype(dtype)
        v = rng.standard_normal((n, num_kv_heads, head_dim)).astype(dtype)
        for t in range(n):
            page, row = ids[t // page_size], t % page_size
            if layout == "NHD":
                k_pages[page, row] = k[t]
                v_pages[page, row] = v[t]
            else:
                k_pages[page, :, row] = k[t]
                v_pages[page, :, row] = v[t]
        ks.append(k)
        vs.append(v)
    return PagedCache(k_pages, v_pages, np.asarray(indptr, np.int32), np.asarray(indices, np.int32),
                      np.asarray(last, np.int32), ks, vs)


def batch_ref(qs, ks, vs, causal, sm_scale=None):
    """Concatenated reference outputs of a batch of (q, k, v) requests."""
    outs, lses = zip(*(attention_ref(q, k, v, causal, sm_scale) for q, k, v in zip(qs, ks, vs)))
    return np.concatenate(outs), np.concatenate(lses)


def indptr_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


# ---- a DLPack tensor that claims a CUDA device -------------------------------------------------
# Only used for arguments that validation rejects before any access: its data pointer is host memory.

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_KEEP = []  # the fake tensors' ctypes buffers live for the test session


class FakeCudaTensor:
    """Exports `array`'s memory via DLPack as if it lived on cuda:`device_id`."""

    def __init__(self, array: np.ndarray, device_id: int = 0):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.device_id = device_id

    def __dlpack_device__(self):
        return (2, self.device_id)

    def __dlpack__(self, **kwargs):
        a = self.array
        codes = {"f": 2, "i": 0, "u": 1}
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(a.ctypes.data, _DLDevice(2, self.device_id), a.ndim,
                                      _DLDataType(codes[a.dtype.kind], a.itemsize * 8, 1), shape, strides, 0)
        managed.manager_ctx = None
        managed.deleter = _DELETER(0)
        _KEEP.extend([shape, strides, managed, a])
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(managed), b"dltensor", None)
