"""Every rejected call through the bindings on the CPU (numpy): ValueError for bad values (shape,
dtype mismatch between arguments, device mismatch, heads, head_dim, lengths, page ids, outputs
sharing memory with another argument) and TypeError for a non-tensor or a dtype the argument can
never take, each message naming the argument, and the outputs (or pools) left untouched.
Layer: tests/python (runs in CI; needs numpy and the built extension).
"""

import numpy as np
import pytest

import gqattn
from gqattn import _C
from reference import FakeCudaTensor, indptr_of, make_paged

POISON = 7.25
HQ, HKV, D, P = 8, 2, 64, 4


@pytest.fixture
def decode_case():
    rng = np.random.default_rng(0)
    cache = make_paged(rng, [9, 6], HKV, D, P, "NHD", np.float32)
    q = rng.standard_normal((2, HQ, D)).astype(np.float32)
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, HQ, HKV, D, P, dtype="fp32")
    out = np.full(q.shape, POISON, np.float32)
    lse = np.full(q.shape[:2], POISON, np.float32)
    return wrapper, cache, q, out, lse


def run_decode(case, **override):
    wrapper, cache, q, out, lse = case
    args = dict(q=q, k_pages=cache.k_pages, v_pages=cache.v_pages, kv_page_indptr=cache.kv_page_indptr,
                kv_page_indices=cache.kv_page_indices, kv_last_page_len=cache.kv_last_page_len, out=out, lse=lse)
    args.update(override)
    return wrapper.run(**args)


def untouched(*arrays):
    return all(np.all(a == POISON) for a in arrays)


@pytest.mark.parametrize("override,error,pattern", [
    (lambda c: {"q": c[2][:, :6]}, ValueError, r"^q: num_qo_heads \(dim 1\) is 6, expected 8"),
    (lambda c: {"q": c[2][None]}, ValueError, r"^q: expected 3 dims"),
    (lambda c: {"q": c[2].astype(np.float16)}, ValueError, r"^q: dtype is fp16, expected fp32 \(the plan's dtype\)"),
    (lambda c: {"q": c[2].astype(np.float64)}, TypeError, r"^q: dtype float64 is not supported"),
    (lambda c: {"q": c[2].tolist()}, TypeError, r"^q: expected a DLPack tensor .* got list"),
    (lambda c: {"q": None}, TypeError, r"^q: a tensor is required"),
    (lambda c: {"q": np.ascontiguousarray(np.swapaxes(c[2], 1, 2)).swapaxes(1, 2)}, ValueError,
     r"^q: last dimension must be contiguous"),
    (lambda c: {"k_pages": c[1].k_pages[:, :, :1]}, ValueError, r"^k_pages: num_kv_heads \(dim 2\) is 1, expected 2"),
    (lambda c: {"v_pages": c[1].v_pages[:-1]}, ValueError, r"^v_pages: shape .* differs from k_pages"),
    (lambda c: {"k_pages": c[1].k_pages.astype(np.float16), "v_pages": c[1].v_pages.astype(np.float16)},
     ValueError, r"^k_pages: dtype is fp16, expected fp32"),
    (lambda c: {"kv_page_indptr": c[1].kv_page_indptr.astype(np.int64)}, TypeError,
     r"^kv_page_indptr: dtype int64 is not supported \(expected int32\)"),
    (lambda c: {"kv_page_indices": c[1].kv_page_indices.astype(np.float32)}, TypeError,
     r"^kv_page_indices: dtype float32 is not supported \(expected int32\)"),
    (lambda c: {"kv_last_page_len": np.array([4, 2], np.int32)}, ValueError,
     r"^kv_page_indptr / kv_last_page_len: request 0 holds 12 keys but the plan was made for 9"),
    (lambda c: {"kv_page_indices": np.where(np.arange(5) == 2, 99, c[1].kv_page_indices).astype(np.int32)}, ValueError,
     r"^kv_page_indices\[2\] \(99\) is outside the page pool"),
    (lambda c: {"out": c[3].astype(np.float16)}, ValueError, r"^out: dtype is fp16, expected fp32"),
    (lambda c: {"out": c[3][:1]}, ValueError, r"^out: tokens \(dim 0\) is 1, expected 2 \(out is \[1, 8, "),
    (lambda c: {"q": c[2].astype(">f4")}, TypeError,
     r"^q: expected a DLPack tensor .* got (numpy\.)?ndarray in big-endian byte order"),
    (lambda c: {"lse": c[4].astype(np.float64)}, TypeError, r"^lse: dtype float64 is not supported \(expected fp32\)"),
    (lambda c: {"lse": c[4][:, :4]}, ValueError, r"^lse: num_qo_heads \(dim 1\) is 4, expected 8"),
    (lambda c: {"q": FakeCudaTensor(c[2])}, ValueError, r"^q: is on cuda:0 but the plan is on cpu"),
    (lambda c: {"kv_page_indices": FakeCudaTensor(c[1].kv_page_indices)}, ValueError,
     r"^kv_page_indices: is on cuda:0 but the plan is on cpu"),
    (lambda c: {"sm_scale": float("nan")}, ValueError, r"^sm_scale \(nan\) must be finite"),
    (lambda c: {"sm_scale": 0.0}, ValueError, r"^sm_scale \(0\) must be nonzero"),
    (lambda c: {"sm_scale": 1e-50}, ValueError, r"^sm_scale \(1e-50\) rounds to 0 in float32"),
    (lambda c: {"stream": -1}, ValueError, r"^stream \(-1\) must be >= 0"),
    (lambda c: {"sm_scale": "x"}, TypeError, r"^sm_scale: expected a float, got str"),
    (lambda c: {"sm_scale": "0.5"}, TypeError, r"^sm_scale: expected a float, got str"),  # float() parses it
    (lambda c: {"sm_scale": True}, TypeError, r"^sm_scale: expected a float, got bool"),
    (lambda c: {"sm_scale": 1e39}, ValueError, r"^sm_scale \(1e\+39\) is past the float32 range"),
])
def test_decode_run_rejects(decode_case, override, error, pattern):
    out, lse = decode_case[3], decode_case[4]
    with pytest.raises(error, match=pattern):
        run_decode(decode_case, **override(decode_case))
    assert untouched(out, lse)


def flat_view(base, shape, offset=0):
    """A contiguous view of `shape` on base's memory, `offset` elements in."""
    return base.reshape(-1)[offset:offset + int(np.prod(shape))].reshape(shape)


def shifted_q(q):
    """(q, out): q's values in a buffer one row longer, out the same buffer one row further on."""
    buf = np.full((q.shape[0] + 1,) + q.shape[1:], POISON, q.dtype)
    buf[:-1] = q
    return buf[:-1], buf[1:]


@pytest.mark.parametrize("override,pattern", [
    (lambda c: {"out": np.lib.stride_tricks.as_strided(c[3], strides=(0,) + c[3].strides[1:])},
     r"^out: dim 0 has stride 0 \(a broadcast view"),
    (lambda c: {"lse": flat_view(c[3], c[4].shape)}, r"^out: shares memory with lse"),
    (lambda c: dict(zip(("q", "out"), shifted_q(c[2]))), r"^out: shares memory with q but is not the same view"),
    (lambda c: {"out": flat_view(c[1].k_pages, c[3].shape, 64)}, r"^out: shares memory with k_pages"),
    (lambda c: {"lse": flat_view(c[2], c[4].shape)}, r"^lse: shares memory with q"),
])
def test_decode_run_rejects_overlapping_outputs(decode_case, override, pattern):
    """An output sharing memory with an input or another output (or itself) gets wrong values or
    corrupts the input: rejected, and nothing written."""
    args = override(decode_case)
    tensors = [decode_case[1].k_pages, decode_case[2], decode_case[3], decode_case[4]] + list(args.values())
    before = [t.copy() for t in tensors]
    with pytest.raises(ValueError, match=pattern):
        run_decode(decode_case, **args)
    for t, b in zip(tensors, before):
        np.testing.assert_array_equal(t, b)


def test_read_only_output_is_a_type_error(decode_case):
    out = decode_case[3]
    frozen = out.copy()
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match=r"^out: must be writable"):
        run_decode(decode_case, out=frozen)
    assert untouched(out, frozen)


def test_output_on_another_device(decode_case):
    with pytest.raises(ValueError, match=r"^out: is on cuda:0 but the plan is on cpu"):
        run_decode(decode_case, out=FakeCudaTensor(decode_case[3]))
    assert untouched(decode_case[3])


def test_wrong_layout_is_a_shape_error(decode_case):
    cache = decode_case[1]
    hnd_k = np.ascontiguousarray(cache.k_pages.transpose(0, 2, 1, 3))  # [pages, heads, page_size, dim]
    with pytest.raises(ValueError, match=r"^k_pages: (page_size|num_kv_heads) \(dim [12]\)"):
        run_decode(decode_case, k_pages=hnd_k, v_pages=hnd_k.copy())
    assert untouched(decode_case[3])


@pytest.mark.parametrize("kwargs,error,pattern", [
    (dict(num_qo_heads=6, num_kv_heads=4), ValueError, r"num_qo_heads \(6\) must be divisible by num_kv_heads \(4\)"),
    (dict(num_kv_heads=0), ValueError, r"num_kv_heads \(0\) must be > 0"),
    (dict(head_dim=0), ValueError, r"head_dim \(0\) must be >= 1"),
    (dict(head_dim=1024), ValueError, r"head_dim \(1024\) must be in \[1, 512\] on the CPU"),
    (dict(page_size=0), ValueError, r"page_size \(0\) must be >= 1: decode reads paged K/V"),
    (dict(kv_last_page_len=[5, 2]), ValueError, r"kv_last_page_len\[0\] \(5\) must be in \[1, page_size \(4\)\]"),
    (dict(kv_last_page_len=[1]), ValueError, r"kv_last_page_len: expected 2 entries"),
    (dict(kv_page_indptr=[0, 3, 2]), ValueError,
     r"^kv_page_indptr must be non-decreasing: kv_page_indptr\[2\] \(2\) < kv_page_indptr\[1\] \(3\)"),
    (dict(kv_page_indptr=[0, 1.5, 2]), TypeError, r"kv_page_indptr\[1\]: expected an int, got float"),
    (dict(kv_page_indptr=[0, 2**40, 2**40]), ValueError, r"kv_page_indptr\[1\] \(1099511627776\) does not fit in int32"),
    (dict(qo_len=4, kv_last_page_len=[1, 2], kv_page_indptr=[0, 1, 2]), ValueError,
     r"request 0: qo_len \(4\) exceeds kv_len \(1\)"),
    (dict(dtype="fp64"), TypeError, r"dtype: unsupported dtype 'fp64'"),
    (dict(dtype=np.int32), TypeError, r"dtype: unsupported dtype"),
    (dict(kv_layout="NDH"), ValueError, r"kv_layout: unknown 'NDH'"),
    (dict(num_qo_heads="8"), TypeError, r"num_qo_heads: expected an int, got str"),
    (dict(kv_page_indices=[0, 1, 2, 9], num_pages=5), ValueError,
     r"kv_page_indices\[3\] \(9\) is outside the page pool \[0, num_pages \(5\)\)"),
    (dict(kv_page_indices=[0, 1, 2, 3]), ValueError, r"^num_pages: must be given with kv_page_indices \(checked mode\)"),
    # An empty list of page ids is checked too (the library read it as "not given").
    (dict(kv_page_indices=[]), ValueError, r"^num_pages: must be given with kv_page_indices"),
    (dict(num_pages=5), ValueError, r"^kv_page_indices: must be given with num_pages \(checked mode\)"),
    (dict(kv_page_indices=[], num_pages=5), ValueError,
     r"kv_page_indices: holds 0 page ids but kv_page_indptr\[batch\] is 4"),
    (dict(kv_page_indices=[0, 1], num_pages=5), ValueError, r"kv_page_indices: holds 2 page ids but kv_page_indptr\[batch\] is 4"),
    (dict(graph_per_split=True), ValueError, r"graph_per_split: set without enable_cuda_graph"),
    (dict(fixed_split_size=-2), ValueError, r"^fixed_split_size \(-2\) must be >= 0"),
    (dict(fixed_split_size=256, max_num_splits=2), ValueError,
     r"^fixed_split_size \(256\) and max_num_splits \(2\): set at most one"),
    (dict(kv_page_indptr=5), TypeError, r"^kv_page_indptr: expected a 1-D sequence of ints, got int"),
    (dict(num_qo_heads=2**40), ValueError, r"^num_qo_heads \(1099511627776\) does not fit in int32"),
    (dict(qo_len=True), TypeError, r"^qo_len: expected an int, got bool"),
    (dict(kv_page_indices=[0, 1, 2, 3], num_pages=2**70), ValueError, r"^num_pages \(\d+\) does not fit in int64"),
])
def test_decode_plan_rejects(kwargs, error, pattern):
    args = dict(kv_page_indptr=[0, 3, 4], kv_last_page_len=[1, 2], num_qo_heads=HQ, num_kv_heads=HKV,
                head_dim=D, page_size=P, dtype="fp32")
    args.update(kwargs)
    wrapper = gqattn.DecodeWrapper(None)
    with pytest.raises(error, match=pattern):
        wrapper.plan(**args)
    with pytest.raises(ValueError, match=r"^plan: handle \d+ has no plan"):
        wrapper.plan_info


def test_run_rejects_a_pool_smaller_than_checked_num_pages(decode_case):
    """Checked mode's num_pages stays with the plan: a run on a smaller pool writes nothing."""
    wrapper, cache, q, out, lse = decode_case
    pages = cache.k_pages.shape[0]
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, HQ, HKV, D, P, dtype="fp32",
                 kv_page_indices=cache.kv_page_indices, num_pages=pages + 1)
    assert wrapper.plan_info.num_pages == pages + 1
    with pytest.raises(ValueError, match=rf"^k_pages: holds {pages} pages but the plan checked its page ids "
                                         rf"against num_pages \({pages + 1}\)"):
        run_decode(decode_case)
    assert untouched(out, lse)


@pytest.mark.parametrize("call", [
    lambda w, q, c: w.run(q, c.k_pages, c.v_pages, c.kv_page_indptr, c.kv_page_indices, c.kv_last_page_len),
    lambda w, q, c: gqattn.decode(q, c.k_pages, c.v_pages, c.kv_page_indptr, c.kv_page_indices, c.kv_last_page_len),
    lambda w, q, c: gqattn.prefill(q, c.k_pages, c.v_pages, [0, 1, 2], c.kv_page_indptr, c.kv_page_indices,
                                   c.kv_last_page_len),
])
@pytest.mark.parametrize("as_list", [False, True])
def test_non_tensor_q_is_a_type_error(decode_case, call, as_list):
    """Without out=, q's shape sizes the output: a q that is not a tensor is a TypeError naming q."""
    wrapper, cache, q = decode_case[:3]
    with pytest.raises(TypeError, match=r"^q: expected a DLPack tensor .* got " + ("list" if as_list else "NoneType")):
        call(wrapper, q.tolist() if as_list else None, cache)


def test_non_tensor_kv_is_a_type_error(decode_case):
    cache, q = decode_case[1:3]
    args = (cache.kv_page_indptr, cache.kv_page_indices, cache.kv_last_page_len)
    with pytest.raises(TypeError, match=r"^k_pages: expected a DLPack tensor .* got list"):
        gqattn.decode(q, cache.k_pages.tolist(), cache.v_pages, *args)
    with pytest.raises(TypeError, match=r"^k: expected a DLPack tensor .* got NoneType"):
        gqattn.prefill(q, None, None, np.array([0, 2], np.int32), np.array([0, 3], np.int32))
    with pytest.raises(TypeError, match=r"^v: expected a DLPack tensor .* got list"):
        gqattn.merge_states([[[[0.0]]]], [[[0.0]]])


def test_block_table_rejects_non_tables():
    with pytest.raises(ValueError, match=r"^block_table: expected 2 dims \[batch, max_pages\], got 1"):
        gqattn.block_table_to_csr(np.array([1, 2], np.int32), [3], 4)
    with pytest.raises(TypeError, match=r"^block_table\[0\]: expected a 1-D sequence of ints, got int"):
        gqattn.block_table_to_csr([1, 2], [3], 4)
    with pytest.raises(TypeError, match=r"^block_table: expected a 2-D table of ints, got NoneType"):
        gqattn.block_table_to_csr(None, [3], 4)
    with pytest.raises(ValueError, match=r"^page_size \(4294967296\) does not fit in int32"):
        gqattn.block_table_to_csr([[1]], [3], 2**32)


@pytest.mark.parametrize("wrapper_type", [gqattn.DecodeWrapper, gqattn.PrefillWrapper])
def test_bad_layout_is_rejected_before_planning(wrapper_type):
    """A CUDA plan writes its work list into the workspace, which the wrapper's previous plan still
    reads: plan() must reject kv_layout before it plans (here, before _C says this build has no CUDA)."""
    wrapper = wrapper_type(FakeCudaTensor(np.zeros(64, np.uint8)))
    indptr = dict(qo_indptr=[0, 1]) if wrapper_type is gqattn.PrefillWrapper else {}
    kv = "kv_indptr" if wrapper_type is gqattn.PrefillWrapper else "kv_page_indptr"
    with pytest.raises(ValueError, match=r"^kv_layout: unknown 'NDH'"):
        wrapper.plan(**indptr, **{kv: [0, 1]}, kv_last_page_len=[3], num_qo_heads=HQ, num_kv_heads=HKV,
                     head_dim=D, page_size=P, dtype="bf16", kv_layout="NDH")


def test_checked_mode_accepts_valid_ids():
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan([0, 3, 4], [1, 2], HQ, HKV, D, P, dtype="fp32", kv_page_indices=[4, 0, 2, 1], num_pages=5)
    assert wrapper.plan_info.kv_len == [9, 2]


def test_run_before_plan():
    q = np.zeros((1, HQ, D), np.float32)
    with pytest.raises(ValueError, match=r"^plan: handle \d+ has no plan \(call plan\(\) before run\(\)\)"):
        gqattn.DecodeWrapper(None).run(q, q, q, q, q, q)


@pytest.fixture
def ragged_case():
    rng = np.random.default_rng(1)
    qo_lens, kv_lens = [3, 5], [4, 5]
    q = rng.standard_normal((8, HQ, D)).astype(np.float16)
    k = rng.standard_normal((9, HKV, D)).astype(np.float16)
    v = rng.standard_normal((9, HKV, D)).astype(np.float16)
    wrapper = gqattn.PrefillWrapper(None)
    qo_indptr, kv_indptr = indptr_of(qo_lens), indptr_of(kv_lens)
    wrapper.plan(qo_indptr, kv_indptr, HQ, HKV, D, causal=True, dtype="fp16")
    out = np.full(q.shape, POISON, np.float16)
    return wrapper, q, k, v, qo_indptr, kv_indptr, out


@pytest.mark.parametrize("override,error,pattern", [
    (lambda c: {"k": c[2][:, :1], "v": c[3][:, :1]}, ValueError, r"^k: num_kv_heads \(dim 1\) is 1, expected 2"),
    (lambda c: {"v": np.ascontiguousarray(np.concatenate([c[3], c[3]], axis=1))[:, :HKV]}, ValueError,
     r"^v: strides \[.*\] differ from k strides"),
    (lambda c: {"k": c[2][:7], "v": c[3][:7]}, ValueError, r"^k: holds 7 rows but the plan's requests need 9"),
    (lambda c: {"kv_indptr": np.array([0, 5, 9], np.int32)}, ValueError,
     r"^kv_indptr: request 0 holds 5 keys but the plan was made for 4"),
    (lambda c: {"qo_indptr": np.array([0, 4, 8], np.int32)}, ValueError,
     r"^qo_indptr\[1\] \(4\) differs from the plan's \(3\)"),
    (lambda c: {"qo_indptr": np.array([0, 3, 8], np.int64)}, TypeError, r"^qo_indptr: dtype int64"),
    (lambda c: {"k": c[2].astype(np.float32), "v": c[3].astype(np.float32)}, ValueError,
     r"^k: dtype is fp32, expected fp16"),
])
def test_prefill_ragged_rejects(ragged_case, override, error, pattern):
    wrapper, q, k, v, qo_indptr, kv_indptr, out = ragged_case
    args = dict(q=q, k=k, v=v, qo_indptr=qo_indptr, kv_indptr=kv_indptr, out=out)
    args.update(override(ragged_case))
    with pytest.raises(error, match=pattern):
        wrapper.run(**args)
    assert untouched(out)


def test_prefill_ragged_plan_takes_no_page_arguments(ragged_case):
    wrapper, q, k, v, qo_indptr, kv_indptr, out = ragged_case
    with pytest.raises(ValueError, match=r"^kv_page_indices, kv_last_page_len: the plan is for ragged K/V"):
        wrapper.run(q, k, v, qo_indptr, kv_indptr, np.zeros(2, np.int32), np.ones(2, np.int32), out=out)
    assert untouched(out)


def test_prefill_out_overlapping_q(ragged_case):
    wrapper, q, k, v, qo_indptr, kv_indptr, out = ragged_case
    q, out = shifted_q(q)
    before = out.base.copy()
    with pytest.raises(ValueError, match=r"^out: shares memory with q but is not the same view"):
        wrapper.run(q, k, v, qo_indptr, kv_indptr, out=out)
    np.testing.assert_array_equal(out.base, before)


def test_prefill_paged_rejects():
    rng = np.random.default_rng(2)
    cache = make_paged(rng, [6, 9], HKV, D, P, "HND", np.float32)
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    qo_indptr = np.array([0, 2, 5], np.int32)
    wrapper = gqattn.PrefillWrapper(None)
    with pytest.raises(ValueError, match=r"^kv_last_page_len: required for paged K/V"):
        wrapper.plan(qo_indptr, cache.kv_page_indptr, HQ, HKV, D, page_size=P, dtype="fp32")
    wrapper.plan(qo_indptr, cache.kv_page_indptr, HQ, HKV, D, page_size=P, kv_last_page_len=cache.kv_last_page_len,
                 causal=True, dtype="fp32", kv_layout="HND")
    out = np.full(q.shape, POISON, np.float32)
    with pytest.raises(ValueError, match=r"^kv_page_indices, kv_last_page_len: required"):
        wrapper.run(q, cache.k_pages, cache.v_pages, qo_indptr, cache.kv_page_indptr, out=out)
    bad = cache.kv_page_indices.copy()
    bad[0] = -1
    with pytest.raises(ValueError, match=r"^kv_page_indices\[0\] \(-1\) is outside the page pool"):
        wrapper.run(q, cache.k_pages, cache.v_pages, qo_indptr, cache.kv_page_indptr, bad, cache.kv_last_page_len,
                    out=out)
    with pytest.raises(ValueError, match=r"^k: num_kv_heads \(dim 1\) is 4, expected 2"):
        wrapper.run(q, cache.k_pages.transpose(0, 2, 1, 3), cache.v_pages.transpose(0, 2, 1, 3), qo_indptr,
                    cache.kv_page_indptr, cache.kv_page_indices, cache.kv_last_page_len, out=out)
    with pytest.raises(ValueError, match=r"^kv_indptr: is on cuda:0 but the plan is on cpu"):
        wrapper.run(q, cache.k_pages, cache.v_pages, qo_indptr, FakeCudaTensor(cache.kv_page_indptr),
                    cache.kv_page_indices, cache.kv_last_page_len, out=out)
    assert untouched(out)


def test_prefill_plan_rejects():
    wrapper = gqattn.PrefillWrapper(None)
    with pytest.raises(ValueError, match=r"request 0: qo_len \(5\) exceeds kv_len \(3\)"):
        wrapper.plan([0, 5], [0, 3], HQ, HKV, D, causal=True, dtype="fp32")
    with pytest.raises(ValueError, match=r"qo_indptr: expected 3 entries"):
        wrapper.plan([0, 5], [0, 3, 6], HQ, HKV, D, dtype="fp32")
    with pytest.raises(ValueError, match=r"kv_last_page_len: must be empty for ragged K/V"):
        _C.prefill_plan(None, [0, 1], [0, 3], [3], HQ, HKV, D, 0, dtype="fp32")
    with pytest.raises(ValueError, match=r"^dtype: unknown 'fp8'"):
        _C.prefill_plan(None, [0, 1], [0, 3], [], HQ, HKV, D, 0, dtype="fp8")
    with pytest.raises(ValueError, match=r"fp32 runs on the CPU backend only|needs the CUDA backend"):
        _C.prefill_plan(FakeCudaTensor(np.zeros(64, np.uint8)), [0, 1], [0, 3], [], HQ, HKV, D, 0, dtype="fp32")


def test_cuda_plan_without_cuda_names_the_option():
    if gqattn.build_info()["cuda"]:
        pytest.skip("this build has CUDA: the no-CUDA message does not apply")
    with pytest.raises(ValueError, match=r"-DGQATTN_CUDA=ON"):
        _C.decode_plan(FakeCudaTensor(np.zeros(64, np.uint8)), [0, 1], [3], HQ, HKV, D, P, dtype="bf16")


def test_append_kv_rejects_and_writes_nothing():
    rng = np.random.default_rng(3)
    cache = make_paged(rng, [5, 3], HKV, D, P, "NHD", np.float32)
    k_before, v_before = cache.k_pages.copy(), cache.v_pages.copy()
    k_new = rng.standard_normal((2, HKV, D)).astype(np.float32)
    batch_indices = np.array([0, 1], np.int32)
    base = dict(k_new=k_new, v_new=k_new.copy(), batch_indices=batch_indices, positions=np.array([5, 3], np.int32),
                k_pages=cache.k_pages, v_pages=cache.v_pages, kv_page_indptr=cache.kv_page_indptr,
                kv_page_indices=cache.kv_page_indices)
    cases = [
        (dict(positions=np.array([5, 4], np.int32)), ValueError,
         r"^positions\[1\] \(4\) lies outside the pages of request 1 \(1 pages of 4 tokens\)"),
        (dict(batch_indices=np.array([0, 2], np.int32)), ValueError, r"^batch_indices\[1\] \(2\) is outside \[0, batch \(2\)\)"),
        (dict(k_new=k_new[:, :1]), ValueError, r"^k_new: num_kv_heads \(dim 1\) is 1, expected 2"),
        (dict(v_new=k_new.astype(np.float16)), ValueError, r"^v_new: dtype is fp16, expected fp32"),
        (dict(positions=np.array([5, 3], np.int64)), TypeError, r"^positions: dtype int64"),
        (dict(kv_page_indices=np.array([0, 1, 50], np.int32)), ValueError,
         r"^kv_page_indices\[\d\] \(50\) is outside the page pool"),
        (dict(k_pages=FakeCudaTensor(cache.k_pages.astype(np.float16)),
              v_pages=FakeCudaTensor(cache.v_pages.astype(np.float16)),
              k_new=k_new.astype(np.float16), v_new=k_new.astype(np.float16)), ValueError,
         r"^k_new: is on cpu but k_pages is on cuda:0"),
        (dict(k_pages=FakeCudaTensor(cache.k_pages), v_pages=FakeCudaTensor(cache.v_pages)), ValueError,
         r"^k_pages: dtype fp32 is not supported on cuda"),
        (dict(v_pages=cache.k_pages), ValueError, r"^k_pages: shares memory with v_pages"),
        (dict(k_new=flat_view(cache.k_pages, k_new.shape)), ValueError, r"^k_pages: shares memory with k_new"),
    ]
    for override, error, pattern in cases:
        args = dict(base)
        args.update(override)
        with pytest.raises(error, match=pattern):
            gqattn.append_kv(**args)
        np.testing.assert_array_equal(cache.k_pages, k_before)
        np.testing.assert_array_equal(cache.v_pages, v_before)


def test_merge_states_rejects():
    v = np.zeros((3, 2, 4, 64), np.float32)
    s = np.zeros((3, 2, 4), np.float32)
    v_merged = np.full((3, 4, 64), POISON, np.float32)
    s_merged = np.full((3, 4), POISON, np.float32)
    with pytest.raises(ValueError, match=r"^s: num_states \(dim 1\) is 3, expected 2"):
        gqattn.merge_states(v, np.zeros((3, 3, 4), np.float32), v_merged, s_merged)
    with pytest.raises(TypeError, match=r"^s: dtype float16 is not supported \(expected fp32\)"):
        gqattn.merge_states(v, s.astype(np.float16), v_merged, s_merged)
    with pytest.raises(ValueError, match=r"^v_merged: head_dim \(dim 2\) is 32, expected 64"):
        gqattn.merge_states(v, s, np.full((3, 4, 32), POISON, np.float32), s_merged)
    with pytest.raises(ValueError, match=r"^v: expected 4 dims"):
        gqattn.merge_states(v[0], s)
    with pytest.raises(ValueError, match=r"^v_merged: shares memory with s_merged"):
        gqattn.merge_states(v, s, v_merged, flat_view(v_merged, s_merged.shape))
    with pytest.raises(ValueError, match=r"^v_merged: shares memory with v"):
        gqattn.merge_states(v, s, flat_view(v, v_merged.shape), s_merged)
    assert untouched(v_merged, s_merged) and not v.any()
