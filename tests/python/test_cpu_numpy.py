"""The bindings on the CPU backend through numpy arrays (fp32 and fp16), against the float64 numpy
reference of reference.py: paged decode (qo_len 1 and 4, NHD and HND, random page tables over a
larger pool), paged and ragged prefill (causal aligned to the end of the KV), MHA / GQA / MQA,
plan reuse across layers, merge_states, append_kv, the page-table helpers and build facts.
Layer: tests/python (runs in CI; needs numpy and the built extension).
"""

import math

import numpy as np
import pytest

import gqattn
from reference import attention_ref, batch_ref, indptr_of, make_paged

HEADS = [(8, 8), (8, 2), (8, 1)]  # (num_qo_heads, num_kv_heads): MHA, GQA, MQA
DTYPES = [np.float32, np.float16]


def tol(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == np.float32 else dict(atol=2e-3, rtol=2e-3)


def dtype_name(dtype):
    return {np.float32: "fp32", np.float16: "fp16"}[dtype]


@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("qo_len", [1, 4])
def test_decode_paged(num_qo_heads, num_kv_heads, dtype, layout, qo_len):
    rng = np.random.default_rng(1)
    head_dim, page_size = 64, 5
    kv_lens = [17, 4, 33, 5]
    cache = make_paged(rng, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype)
    q = rng.standard_normal((len(kv_lens) * qo_len, num_qo_heads, head_dim)).astype(dtype)
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 qo_len=qo_len, dtype=dtype_name(dtype), kv_layout=layout)
    out, lse = wrapper.run(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices,
                           cache.kv_last_page_len, return_lse=True)
    qs = [q[b * qo_len:(b + 1) * qo_len] for b in range(len(kv_lens))]
    ref_o, ref_lse = batch_ref(qs, cache.k, cache.v, causal=True)
    assert out.dtype == dtype and out.shape == q.shape
    np.testing.assert_allclose(out.astype(np.float64), ref_o, **tol(dtype))
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_ragged(num_qo_heads, num_kv_heads, dtype, causal):
    rng = np.random.default_rng(2)
    head_dim = 64
    qo_lens, kv_lens = [7, 1, 12, 3], [7, 9, 30, 3]
    q = rng.standard_normal((sum(qo_lens), num_qo_heads, head_dim)).astype(dtype)
    k = rng.standard_normal((sum(kv_lens), num_kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((sum(kv_lens), num_kv_heads, head_dim)).astype(dtype)
    qo_indptr, kv_indptr = indptr_of(qo_lens), indptr_of(kv_lens)
    wrapper = gqattn.PrefillWrapper(None)
    wrapper.plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, causal=causal, dtype=dtype)
    out, lse = wrapper.run(q, k, v, qo_indptr, kv_indptr, return_lse=True, sm_scale=0.1)
    split = lambda x, ind: [x[ind[b]:ind[b + 1]] for b in range(len(ind) - 1)]  # noqa: E731
    ref_o, ref_lse = batch_ref(split(q, qo_indptr), split(k, kv_indptr), split(v, kv_indptr), causal, 0.1)
    np.testing.assert_allclose(out.astype(np.float64), ref_o, **tol(dtype))
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_prefill_paged_chunked_causal(num_qo_heads, num_kv_heads, layout):
    """Chunked prefill: qo_len < kv_len, the causal mask aligned to the end of the KV."""
    rng = np.random.default_rng(3)
    head_dim, page_size, dtype = 128, 16, np.float32
    qo_lens, kv_lens = [5, 16, 1], [40, 16, 23]
    cache = make_paged(rng, kv_lens, num_kv_heads, head_dim, page_size, layout, dtype)
    q = rng.standard_normal((sum(qo_lens), num_qo_heads, head_dim)).astype(dtype)
    qo_indptr = indptr_of(qo_lens)
    out = gqattn.prefill(q, cache.k_pages, cache.v_pages, qo_indptr, cache.kv_page_indptr,
                         kv_page_indices=cache.kv_page_indices, kv_last_page_len=cache.kv_last_page_len,
                         causal=True, kv_layout=layout)
    qs = [q[qo_indptr[b]:qo_indptr[b + 1]] for b in range(len(qo_lens))]
    ref_o, _ = batch_ref(qs, cache.k, cache.v, causal=True)
    np.testing.assert_allclose(out, ref_o, **tol(dtype))
    # Row i of a request sees kv_len - qo_len + i + 1 keys: the first row of request 0 sees 36.
    first = attention_ref(q[:1], cache.k[0][:36], cache.v[0][:36], causal=False)[0]
    np.testing.assert_allclose(out[:1], first, **tol(dtype))


def test_empty_kv_gives_zero_and_minus_inf():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    k = np.zeros((0, 2, 64), np.float32)
    out, lse = gqattn.prefill(q, k, k.copy(), np.array([0, 2], np.int32), np.array([0, 0], np.int32),
                              return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_functional_decode_matches_wrapper():
    rng = np.random.default_rng(5)
    cache = make_paged(rng, [9, 20], 2, 64, 4, "NHD", np.float16)
    q = rng.standard_normal((2, 8, 64)).astype(np.float16)
    args = (cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices, cache.kv_last_page_len)
    out = gqattn.decode(q, *args)
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, 8, 2, 64, 4, dtype=np.float16)
    np.testing.assert_array_equal(out, wrapper.run(q, *args))


def test_functional_decode_of_no_request_is_empty():
    q = np.zeros((0, 8, 64), np.float32)
    pages = np.zeros((1, 4, 2, 64), np.float32)
    none = np.zeros(0, np.int32)
    out = gqattn.decode(q, pages, pages.copy(), np.array([0], np.int32), none, none)
    assert out.shape == (0, 8, 64)
    with pytest.raises(ValueError, match=r"^q: 2 tokens but kv_page_indptr holds no request"):
        gqattn.decode(np.zeros((2, 8, 64), np.float32), pages, pages.copy(), np.array([0], np.int32), none, none)


def test_plan_reused_across_layers():
    """One plan per step, one run per layer: each layer's pools give that layer's reference."""
    rng = np.random.default_rng(6)
    num_layers, kv_lens, page_size = 4, [12, 31, 7], 8
    caches = [make_paged(np.random.default_rng(100 + i), kv_lens, 2, 64, page_size, "HND", np.float32)
              for i in range(num_layers)]
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan(caches[0].kv_page_indptr, caches[0].kv_last_page_len, 8, 2, 64, page_size, dtype="fp32",
                 kv_layout="HND")
    plan_before = repr(wrapper.plan_info)
    out = np.empty((3, 8, 64), np.float32)
    for layer_cache in caches:
        q = rng.standard_normal((3, 8, 64)).astype(np.float32)
        result = wrapper.run(q, layer_cache.k_pages, layer_cache.v_pages, layer_cache.kv_page_indptr,
                             layer_cache.kv_page_indices, layer_cache.kv_last_page_len, out=out)
        assert result is out
        ref_o, _ = batch_ref([q[b:b + 1] for b in range(3)], layer_cache.k, layer_cache.v, causal=True)
        np.testing.assert_allclose(out, ref_o, **tol(np.float32))
    assert repr(wrapper.plan_info) == plan_before


def test_replan_changes_lengths():
    rng = np.random.default_rng(7)
    wrapper = gqattn.DecodeWrapper(None)
    for kv_lens in ([5, 9], [30, 1], [64, 64]):
        cache = make_paged(rng, kv_lens, 1, 64, 16, "NHD", np.float32)
        q = rng.standard_normal((2, 4, 64)).astype(np.float32)
        wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, 4, 1, 64, 16, dtype="fp32")
        assert wrapper.plan_info.kv_len == kv_lens
        out = wrapper.run(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices,
                          cache.kv_last_page_len)
        np.testing.assert_allclose(out, batch_ref([q[:1], q[1:]], cache.k, cache.v, True)[0], **tol(np.float32))


class _NumpyOneArray(np.ndarray):
    """A numpy array as numpy < 2 makes them: no __array_namespace__ (the array API came in 2.0)."""

    @property
    def __array_namespace__(self):
        raise AttributeError("__array_namespace__")


def test_outputs_allocated_for_numpy_without_array_api():
    rng = np.random.default_rng(13)
    cache = make_paged(rng, [7, 2], 2, 64, 4, "HND", np.float16)
    q = rng.standard_normal((2, 8, 64)).astype(np.float16).view(_NumpyOneArray)
    assert not hasattr(q, "__array_namespace__")
    out, lse = gqattn.decode(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices,
                             cache.kv_last_page_len, kv_layout="HND", return_lse=True)
    ref_o, ref_lse = batch_ref([q[:1], q[1:]], cache.k, cache.v, True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    np.testing.assert_allclose(out.astype(np.float64), ref_o, **tol(np.float16))
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-5)


def test_strided_q_and_out():
    """Views that are contiguous only in the last dimension need no copy."""
    rng = np.random.default_rng(8)
    cache = make_paged(rng, [10, 3], 2, 64, 4, "NHD", np.float32)
    big_q = rng.standard_normal((2, 16, 64)).astype(np.float32)
    q = big_q[:, ::2]
    out_storage = np.zeros((2, 8, 128), np.float32)
    out = out_storage[:, :, :64]
    gqattn.decode(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices,
                  cache.kv_last_page_len, out=out)
    np.testing.assert_allclose(out, batch_ref([q[:1], q[1:]], cache.k, cache.v, True)[0], **tol(np.float32))
    assert np.all(out_storage[:, :, 64:] == 0)


def test_out_may_be_q_itself():
    """o = q (the same view) is allowed: each row of q is read before its row of o is written."""
    rng = np.random.default_rng(12)
    cache = make_paged(rng, [10, 3], 2, 64, 4, "NHD", np.float32)
    q = rng.standard_normal((2, 8, 64)).astype(np.float32)
    ref_o, _ = batch_ref([q[:1], q[1:]], cache.k, cache.v, True)
    out = gqattn.decode(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices,
                        cache.kv_last_page_len, out=q)
    assert out is q
    np.testing.assert_allclose(q, ref_o, **tol(np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_states(dtype):
    rng = np.random.default_rng(9)
    q = rng.standard_normal((3, 4, 64))
    k = rng.standard_normal((40, 4, 64))
    v = rng.standard_normal((40, 4, 64))
    cuts = [0, 13, 13, 40]  # the middle state is empty
    parts = [attention_ref(q, k[a:b], v[a:b], causal=False) for a, b in zip(cuts[:-1], cuts[1:])]
    vs = np.stack([p[0] for p in parts], axis=1).astype(dtype)  # [n, states, heads, dim]
    ss = np.stack([p[1] for p in parts], axis=1).astype(np.float32)
    merged_v, merged_s = gqattn.merge_states(vs, ss)
    full_o, full_lse = attention_ref(q, k, v, causal=False)
    assert merged_v.dtype == dtype and merged_v.shape == (3, 4, 64) and merged_s.shape == (3, 4)
    np.testing.assert_allclose(merged_v.astype(np.float64), full_o, **tol(dtype))
    np.testing.assert_allclose(merged_s, full_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("one_cache", [False, True])
def test_append_kv_then_decode(layout, one_cache):
    rng = np.random.default_rng(10)
    page_size, heads, head_dim = 4, 2, 64
    cache = make_paged(rng, [6, 9], heads, head_dim, page_size, layout, np.float32)
    if one_cache:  # K and V pages interleaved in one [num_pages, 2, ...] tensor: outputs apart, spans not
        both = np.stack([cache.k_pages, cache.v_pages], axis=1)
        cache.k_pages, cache.v_pages = both[:, 0], both[:, 1]
    # Two new tokens for request 0 (positions 6, 7: page 1, rows 2 and 3), one for request 1.
    k_new = rng.standard_normal((3, heads, head_dim)).astype(np.float32)
    v_new = rng.standard_normal((3, heads, head_dim)).astype(np.float32)
    batch_indices = np.array([0, 0, 1], np.int32)
    positions = np.array([6, 7, 9], np.int32)
    last = np.array([4, 2], np.int32)  # the lengths after the append: 8 and 10
    before_k = cache.k_pages.copy()
    gqattn.append_kv(k_new, v_new, batch_indices, positions, cache.k_pages, cache.v_pages, cache.kv_page_indptr,
                     cache.kv_page_indices, last, kv_layout=layout)
    page_of = lambda b, pos: cache.kv_page_indices[cache.kv_page_indptr[b] + pos // page_size]  # noqa: E731
    for t, (b, pos) in enumerate(zip(batch_indices, positions)):
        slot = (page_of(b, pos), pos % page_size)
        got = cache.k_pages[slot] if layout == "NHD" else cache.k_pages[slot[0], :, slot[1]]
        np.testing.assert_array_equal(got, k_new[t])
    changed = np.argwhere(np.any(before_k != cache.k_pages, axis=-1))
    assert len(changed) == 3 * heads
    ks = [np.concatenate([cache.k[0], k_new[:2]]), np.concatenate([cache.k[1], k_new[2:]])]
    vs = [np.concatenate([cache.v[0], v_new[:2]]), np.concatenate([cache.v[1], v_new[2:]])]
    q = rng.standard_normal((2, 8, head_dim)).astype(np.float32)
    out = gqattn.decode(q, cache.k_pages, cache.v_pages, cache.kv_page_indptr, cache.kv_page_indices, last,
                        kv_layout=layout)
    np.testing.assert_allclose(out, batch_ref([q[:1], q[1:]], ks, vs, True)[0], **tol(np.float32))


def test_block_table_round_trip():
    table = np.array([[3, 7, 1], [4, 0, 0], [5, 6, 0]], np.int32)
    kv_len = [9, 2, 5]
    indptr, indices, last = gqattn.block_table_to_csr(table, kv_len, page_size=4)
    np.testing.assert_array_equal(indptr, [0, 3, 4, 6])
    np.testing.assert_array_equal(indices, [3, 7, 1, 4, 5, 6])
    np.testing.assert_array_equal(last, [1, 2, 1])
    assert indptr.dtype == np.int32
    back, lens = gqattn.csr_to_block_table(indptr, indices, last, page_size=4)
    np.testing.assert_array_equal(lens, kv_len)
    for b, n in enumerate(kv_len):
        pages = -(-n // 4)
        np.testing.assert_array_equal(back[b, :pages], table[b, :pages])
    with pytest.raises(ValueError, match="page_size"):
        gqattn.block_table_to_csr(table, kv_len, page_size=0)


def test_build_facts():
    info = gqattn.build_info()
    assert set(info) == {"cuda", "head_dims", "dtypes", "cuda_archs"}
    assert gqattn.cuda_device_count() >= 0
    assert gqattn.kRecommendedWorkspaceBytes == 128 << 20
    if not info["cuda"]:
        assert gqattn.cuda_device_count() == 0


def test_default_scale_is_inverse_sqrt_head_dim():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((4, 2, 32)).astype(np.float32)
    k = rng.standard_normal((6, 2, 32)).astype(np.float32)
    v = rng.standard_normal((6, 2, 32)).astype(np.float32)
    ind_q, ind_k = np.array([0, 4], np.int32), np.array([0, 6], np.int32)
    a = gqattn.prefill(q, k, v, ind_q, ind_k)
    b = gqattn.prefill(q, k, v, ind_q, ind_k, sm_scale=1 / math.sqrt(32))
    np.testing.assert_allclose(a, b, atol=1e-6)
