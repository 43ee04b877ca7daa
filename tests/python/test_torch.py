"""torch tensors through gqattn: on the CPU (bf16 / fp16 / fp32 against the float64 reference, the
custom ops' registration via opcheck, torch.compile(fullgraph=True) with re-plans and no recompile),
and on the GPU (marked gpu): equality with the CPU backend on the same inputs for decode, prefill
(paged and ragged), append_kv and merge_states, torch.compile, CUDA-graph capture and replay of
decode with a re-plan between replays, side streams, and the GPU-only rejections.
Layer: tests/python (skipped, with the reason shown, when torch is not importable).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests (CPU and GPU) are skipped")

import gqattn  # noqa: E402
from reference import batch_ref, indptr_of, make_paged  # noqa: E402

HEADS = [(8, 8), (8, 2), (8, 1)]
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def has_gpu():
    return torch.cuda.is_available() and gqattn.build_info()["cuda"] and gqattn.cuda_device_count() > 0


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(
    not has_gpu(),
    reason="GPU tests need torch.cuda.is_available() and gqattn built with CUDA "
           f"(torch.cuda.is_available()={torch.cuda.is_available()}, build cuda={gqattn.build_info()['cuda']})")


def built_gpu_variants():
    info = gqattn.build_info()
    return [(d, h) for d in ("bf16", "fp16") for h in (64, 128)
            if d in info["dtypes"] and h in info["head_dims"]]


def skip_unless_built(dtype, head_dim):
    if (dtype, head_dim) not in built_gpu_variants():
        pytest.skip(f"{dtype} head_dim {head_dim} is not compiled in this build (GQATTN_DTYPES / GQATTN_HEAD_DIMS)")


def tol(dtype):
    return {"fp32": dict(atol=2e-5, rtol=2e-5), "fp16": dict(atol=2e-3, rtol=2e-3),
            "bf16": dict(atol=2e-2, rtol=2e-2)}[dtype]


def to_torch(array, dtype, device="cpu"):
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=TORCH_DTYPES[dtype])


def paged_torch(cache, dtype, device):
    """The numpy cache's tensors on `device`, pools in `dtype`."""
    return dict(k_pages=to_torch(cache.k_pages, dtype, device), v_pages=to_torch(cache.v_pages, dtype, device),
                kv_page_indptr=torch.from_numpy(cache.kv_page_indptr).to(device),
                kv_page_indices=torch.from_numpy(cache.kv_page_indices).to(device),
                kv_last_page_len=torch.from_numpy(cache.kv_last_page_len).to(device))


def cpu_copy(tensors):
    return {k: v.cpu() for k, v in tensors.items()}


# ---- CPU torch ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
def test_cpu_decode_torch(dtype, num_qo_heads, num_kv_heads):
    rng = np.random.default_rng(0)
    kv_lens, page_size, head_dim, qo_len = [11, 26, 3], 4, 64, 2
    cache = make_paged(rng, kv_lens, num_kv_heads, head_dim, page_size, "HND", np.float32)
    t = paged_torch(cache, dtype, "cpu")
    q = to_torch(rng.standard_normal((6, num_qo_heads, head_dim)), dtype)
    wrapper = gqattn.DecodeWrapper(gqattn.make_workspace("cpu", 0))
    wrapper.plan(t["kv_page_indptr"], t["kv_last_page_len"], num_qo_heads, num_kv_heads, head_dim, page_size,
                 qo_len=qo_len, dtype=TORCH_DTYPES[dtype], kv_layout="HND")
    out, lse = wrapper.run(q, **t, return_lse=True)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    # The reference reads the same rounded values back out of the pools.
    ks = [_rows(t["k_pages"], cache, b, page_size) for b in range(3)]
    vs = [_rows(t["v_pages"], cache, b, page_size) for b in range(3)]
    qf = q.float().numpy()
    ref_o, ref_lse = batch_ref([qf[2 * b:2 * b + 2] for b in range(3)], ks, vs, causal=True)
    np.testing.assert_allclose(out.float().numpy(), ref_o, **tol(dtype))
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=1e-4, rtol=1e-4)


def _rows(pool_hnd, cache, b, page_size):
    """Request b's keys [kv_len, heads, dim] as float64, read from an HND pool."""
    pool = pool_hnd.float().numpy()
    n = len(cache.k[b])
    ids = cache.kv_page_indices[cache.kv_page_indptr[b]:cache.kv_page_indptr[b + 1]]
    return np.stack([pool[ids[i // page_size], :, i % page_size] for i in range(n)]) if n else pool[:0, :, 0]


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_prefill_ragged_bf16(causal):
    rng = np.random.default_rng(1)
    qo_lens, kv_lens = [4, 9], [6, 9]
    q = to_torch(rng.standard_normal((13, 8, 128)), "bf16")
    k = to_torch(rng.standard_normal((15, 2, 128)), "bf16")
    v = to_torch(rng.standard_normal((15, 2, 128)), "bf16")
    qo_indptr = torch.from_numpy(indptr_of(qo_lens))
    kv_indptr = torch.from_numpy(indptr_of(kv_lens))
    out = gqattn.prefill(q, k, v, qo_indptr, kv_indptr, causal=causal)
    qf, kf, vf = (x.float().numpy() for x in (q, k, v))
    ref, _ = batch_ref([qf[:4], qf[4:]], [kf[:6], kf[6:]], [vf[:6], vf[6:]], causal)
    np.testing.assert_allclose(out.float().numpy(), ref, **tol("bf16"))


def test_cpu_append_merge_and_tables_torch():
    rng = np.random.default_rng(2)
    cache = make_paged(rng, [5, 2], 2, 64, 4, "NHD", np.float32)
    t = paged_torch(cache, "fp16", "cpu")
    k_new = to_torch(rng.standard_normal((1, 2, 64)), "fp16")
    gqattn.append_kv(k_new, k_new.clone(), torch.tensor([1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
                     t["k_pages"], t["v_pages"], t["kv_page_indptr"], t["kv_page_indices"])
    page = int(cache.kv_page_indices[cache.kv_page_indptr[1]])
    assert torch.equal(t["k_pages"][page, 2], k_new[0])

    v = to_torch(rng.standard_normal((3, 2, 4, 64)), "fp32")
    s = torch.tensor(rng.standard_normal((3, 2, 4)), dtype=torch.float32)
    vm, sm = gqattn.merge_states(v, s)
    w = torch.softmax(s, dim=1)
    torch.testing.assert_close(vm, (w[..., None] * v).sum(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sm, torch.logsumexp(s, dim=1), atol=1e-5, rtol=1e-5)

    indptr, indices, last = gqattn.block_table_to_csr(torch.tensor([[2, 5], [1, 0]]), [6, 3], 4)
    assert isinstance(indptr, torch.Tensor) and indptr.dtype == torch.int32
    assert indices.tolist() == [2, 5, 1] and last.tolist() == [2, 3]


def test_cpu_torch_type_errors():
    q = torch.zeros(1, 8, 64)
    wrapper = gqattn.DecodeWrapper(None)
    wrapper.plan([0, 1], [3], 8, 2, 64, 4, dtype=torch.float32)
    pools = torch.zeros(2, 4, 2, 64)
    out = torch.full_like(q, 7.25)
    with pytest.raises(TypeError, match=r"^kv_page_indices: expected a torch.Tensor"):
        wrapper.run(q, pools, pools, torch.tensor([0, 1], dtype=torch.int32), [0],
                    torch.tensor([3], dtype=torch.int32), out=out)
    with pytest.raises(TypeError, match=r"^kv_page_indptr: dtype int64 is not supported \(expected int32\)"):
        wrapper.run(q, pools, pools, torch.tensor([0, 1]), torch.tensor([0], dtype=torch.int32),
                    torch.tensor([3], dtype=torch.int32), out=out)
    with pytest.raises(ValueError, match=r"^q: dtype is bf16, expected fp32"):
        wrapper.run(q.bfloat16(), pools, pools, torch.tensor([0, 1], dtype=torch.int32),
                    torch.tensor([0], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), out=out)
    assert torch.all(out == 7.25)


def test_cpu_meta_tensors_are_rejected():
    """A meta tensor among real ones sent the whole call to the ops' fake implementations, which
    compute and check nothing; a call on meta tensors alone planned for CUDA."""
    wrapper, q, t = _decode_op_args()
    out = torch.full_like(q, 7.25)
    meta_last = t["kv_last_page_len"].to("meta")
    with pytest.raises(ValueError, match=r"^kv_last_page_len: is on meta, q is on cpu"):
        wrapper.run(q, t["k_pages"], t["v_pages"], t["kv_page_indptr"], t["kv_page_indices"], meta_last, out=out)
    assert torch.all(out == 7.25)
    with pytest.raises(ValueError, match=r"^q: is on meta; gqattn runs on cpu or cuda tensors"):
        gqattn.decode(q.to("meta"), t["k_pages"], t["v_pages"], t["kv_page_indptr"], t["kv_page_indices"],
                      t["kv_last_page_len"])


def _decode_op_args(dtype="fp32", device="cpu", head_dim=64):
    rng = np.random.default_rng(3)
    cache = make_paged(rng, [7, 12], 2, head_dim, 4, "NHD", np.float32)
    t = paged_torch(cache, dtype, device)
    q = to_torch(rng.standard_normal((2, 8, head_dim)), dtype, device)
    ws = gqattn.make_workspace(device) if device != "cpu" else None
    wrapper = gqattn.DecodeWrapper(ws)
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, 8, 2, head_dim, 4, dtype=dtype)
    return wrapper, q, t


def test_cpu_opcheck():
    wrapper, q, t = _decode_op_args()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2])
    args = (wrapper.handle, q, t["k_pages"], t["v_pages"], t["kv_page_indptr"], t["kv_page_indices"],
            t["kv_last_page_len"], out, lse, 0.125)
    torch.library.opcheck(torch.ops.gqattn.decode_run.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_cpu_compile_fullgraph_replans_without_recompiling():
    torch._dynamo.reset()
    wrapper, q, t = _decode_op_args()

    def step(q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len):
        out, lse = wrapper.run(q * 2, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len,
                               return_lse=True, sm_scale=0.1)
        return out.float() + 1, lse

    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q, **t)
    want = step(q, **t)
    torch.testing.assert_close(got, want)
    # A re-plan with other lengths over the same pools (tensors of the same shapes) keeps the
    # handle: the compiled function runs the new plan without recompiling.
    t2 = dict(t, kv_page_indptr=torch.tensor([0, 1, 5], dtype=torch.int32),
              kv_page_indices=torch.tensor([3, 0, 8, 2, 6], dtype=torch.int32),
              kv_last_page_len=torch.tensor([3, 4], dtype=torch.int32))
    wrapper.plan(t2["kv_page_indptr"], t2["kv_last_page_len"], 8, 2, 64, 4, dtype="fp32")
    assert wrapper.plan_info.kv_len == [3, 16]
    with torch._dynamo.config.patch(error_on_recompile=True):
        got2 = compiled(q, **t2)
    torch.testing.assert_close(got2, step(q, **t2))


# ---- GPU ----------------------------------------------------------------------------------------

@gpu
@needs_gpu
@pytest.mark.parametrize("dtype,head_dim", [("bf16", 64), ("bf16", 128), ("fp16", 64), ("fp16", 128)])
@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("qo_len", [1, 4])
def test_gpu_decode_matches_cpu(dtype, head_dim, num_qo_heads, num_kv_heads, layout, qo_len):
    skip_unless_built(dtype, head_dim)
    rng = np.random.default_rng(10)
    kv_lens, page_size = [37, 4, 300, 16, 129], 16
    cache = make_paged(rng, kv_lens, num_kv_heads, head_dim, page_size, layout, np.float32)
    t = paged_torch(cache, dtype, "cuda")
    q = to_torch(rng.standard_normal((len(kv_lens) * qo_len, num_qo_heads, head_dim)), dtype, "cuda")
    wrapper = gqattn.DecodeWrapper(gqattn.make_workspace("cuda"))
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 qo_len=qo_len, dtype=dtype, kv_layout=layout)
    out, lse = wrapper.run(q, **t, return_lse=True)
    ref_out, ref_lse = gqattn.decode(q.cpu(), **cpu_copy(t), kv_layout=layout, return_lse=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), **tol(dtype))
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=2e-3, rtol=2e-3)


@gpu
@needs_gpu
@pytest.mark.parametrize("num_kv_heads", [1, 8])
def test_gpu_decode_split_kv_matches_cpu(num_kv_heads):
    dtype, head_dim = built_gpu_variants()[0] if built_gpu_variants() else ("bf16", 128)
    skip_unless_built(dtype, head_dim)
    rng = np.random.default_rng(11)
    cache = make_paged(rng, [6000], num_kv_heads, head_dim, 16, "NHD", np.float32)
    t = paged_torch(cache, dtype, "cuda")
    q = to_torch(rng.standard_normal((1, 8, head_dim)), dtype, "cuda")
    wrapper = gqattn.DecodeWrapper(gqattn.make_workspace("cuda"))
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, 8, num_kv_heads, head_dim, 16, dtype=dtype)
    out = wrapper.run(q, **t)
    ref = gqattn.decode(q.cpu(), **cpu_copy(t))
    torch.testing.assert_close(out.cpu().float(), ref.float(), **tol(dtype))
    # fixed_split_size: 6000 keys in chunks of 1000 rounded up to the kernel's tile (64 or 128 keys).
    wrapper.plan(cache.kv_page_indptr, cache.kv_last_page_len, 8, num_kv_heads, head_dim, 16, dtype=dtype,
                 fixed_split_size=1000)
    assert wrapper.plan_info.kv_chunk == 1024 and wrapper.plan_info.max_splits == 6
    torch.testing.assert_close(wrapper.run(q, **t).cpu().float(), ref.float(), **tol(dtype))


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype,head_dim", [("bf16", 64), ("bf16", 128), ("fp16", 128)])
@pytest.mark.parametrize("num_qo_heads,num_kv_heads", HEADS)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_prefill_matches_cpu(dtype, head_dim, num_qo_heads, num_kv_heads, paged, causal):
    skip_unless_built(dtype, head_dim)
    rng = np.random.default_rng(12)
    qo_lens, kv_lens = [100, 1, 37, 256], [180, 1, 37, 300]
    q = to_torch(rng.standard_normal((sum(qo_lens), num_qo_heads, head_dim)), dtype, "cuda")
    qo_indptr = torch.from_numpy(indptr_of(qo_lens)).cuda()
    if paged:
        cache = make_paged(rng, kv_lens, num_kv_heads, head_dim, 16, "HND", np.float32)
        t = paged_torch(cache, dtype, "cuda")
        kv = dict(k=t["k_pages"], v=t["v_pages"], kv_indptr=t["kv_page_indptr"],
                  kv_page_indices=t["kv_page_indices"], kv_last_page_len=t["kv_last_page_len"])
    else:
        kv = dict(k=to_torch(rng.standard_normal((sum(kv_lens), num_kv_heads, head_dim)), dtype, "cuda"),
                  v=to_torch(rng.standard_normal((sum(kv_lens), num_kv_heads, head_dim)), dtype, "cuda"),
                  kv_indptr=torch.from_numpy(indptr_of(kv_lens)).cuda())
    out, lse = gqattn.prefill(q, qo_indptr=qo_indptr, causal=causal, kv_layout="HND", return_lse=True, **kv)
    ref_out, ref_lse = gqattn.prefill(q.cpu(), qo_indptr=qo_indptr.cpu(), causal=causal, kv_layout="HND",
                                      return_lse=True, **cpu_copy(kv))
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), **tol(dtype))
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=2e-3, rtol=2e-3)


@gpu
@needs_gpu
def test_gpu_plan_reused_across_layers():
    dtype, head_dim = built_gpu_variants()[0]
    rng = np.random.default_rng(13)
    kv_lens = [50, 200, 7]
    wrapper = gqattn.DecodeWrapper(gqattn.make_workspace("cuda"))
    layers = [make_paged(np.random.default_rng(20 + i), kv_lens, 2, head_dim, 16, "NHD", np.float32)
              for i in range(4)]
    wrapper.plan(layers[0].kv_page_indptr, layers[0].kv_last_page_len, 8, 2, head_dim, 16, dtype=dtype)
    out = torch.empty(3, 8, head_dim, dtype=TORCH_DTYPES[dtype], device="cuda")
    for cache in layers:
        t = paged_torch(cache, dtype, "cuda")
        q = to_torch(rng.standard_normal((3, 8, head_dim)), dtype, "cuda")
        assert wrapper.run(q, **t, out=out) is out
        torch.testing.assert_close(out.cpu().float(), gqattn.decode(q.cpu(), **cpu_copy(t)).float(), **tol(dtype))


@gpu
@needs_gpu
def test_gpu_append_kv_and_merge_states_match_cpu():
    dtype, head_dim = built_gpu_variants()[0]
    rng = np.random.default_rng(14)
    cache = make_paged(rng, [20, 33], 2, head_dim, 16, "NHD", np.float32)
    t = paged_torch(cache, dtype, "cuda")
    c = cpu_copy(t)
    k_new = to_torch(rng.standard_normal((3, 2, head_dim)), dtype, "cuda")
    v_new = to_torch(rng.standard_normal((3, 2, head_dim)), dtype, "cuda")
    bi = torch.tensor([0, 1, 1], dtype=torch.int32)
    pos = torch.tensor([20, 2, 33], dtype=torch.int32)
    args = ("kv_page_indptr", "kv_page_indices")
    gqattn.append_kv(k_new, v_new, bi.cuda(), pos.cuda(), t["k_pages"], t["v_pages"], *(t[a] for a in args))
    gqattn.append_kv(k_new.cpu(), v_new.cpu(), bi, pos, c["k_pages"], c["v_pages"], *(c[a] for a in args))
    assert torch.equal(t["k_pages"].cpu(), c["k_pages"]) and torch.equal(t["v_pages"].cpu(), c["v_pages"])

    v = to_torch(rng.standard_normal((5, 3, 8, head_dim)), dtype, "cuda")
    s = torch.tensor(rng.standard_normal((5, 3, 8)), dtype=torch.float32, device="cuda")
    s[0, 1] = -math.inf
    vm, sm = gqattn.merge_states(v, s)
    vm_ref, sm_ref = gqattn.merge_states(v.cpu(), s.cpu())
    torch.testing.assert_close(vm.cpu().float(), vm_ref.float(), **tol(dtype))
    torch.testing.assert_close(sm.cpu(), sm_ref, atol=1e-4, rtol=1e-4)


@gpu
@needs_gpu
def test_gpu_side_stream():
    dtype, head_dim = built_gpu_variants()[0]
    wrapper, q, t = _decode_op_args(dtype, "cuda", head_dim)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = wrapper.run(q, **t)
    stream.synchronize()
    torch.testing.assert_close(out.cpu().float(), gqattn.decode(q.cpu(), **cpu_copy(t)).float(), **tol(dtype))


@gpu
@needs_gpu
def test_gpu_functional_explicit_stream_keeps_workspace():
    """decode(..., stream=s) frees its temporary workspace on return: the allocator must not hand
    that memory to the current stream while s still runs (record_stream). Other allocations on the
    current stream follow at once, then s is checked."""
    dtype, head_dim = built_gpu_variants()[0]
    _, q, t = _decode_op_args(dtype, "cuda", head_dim)
    stream = torch.cuda.Stream()
    outs = []
    for _ in range(4):
        stream.wait_stream(torch.cuda.current_stream())  # the inputs and the fresh workspace are ready
        outs.append(gqattn.decode(q, **t, stream=stream))
        junk = torch.full((gqattn.kRecommendedWorkspaceBytes,), 255, dtype=torch.uint8, device="cuda")
        del junk
    stream.synchronize()
    ref = gqattn.decode(q.cpu(), **cpu_copy(t)).float()
    for out in outs:
        torch.testing.assert_close(out.cpu().float(), ref, **tol(dtype))


@gpu
@needs_gpu
def test_gpu_compile_fullgraph():
    torch._dynamo.reset()
    dtype, head_dim = built_gpu_variants()[0]
    rng = np.random.default_rng(15)
    cache = make_paged(rng, [40, 90], 2, head_dim, 16, "NHD", np.float32)
    t = paged_torch(cache, dtype, "cuda")
    q = to_torch(rng.standard_normal((2, 8, head_dim)), dtype, "cuda")
    qp = to_torch(rng.standard_normal((30, 8, head_dim)), dtype, "cuda")
    qo_indptr = torch.tensor([0, 10, 30], dtype=torch.int32, device="cuda")
    ws_d, ws_p = gqattn.make_workspace("cuda"), gqattn.make_workspace("cuda")
    dec, pre = gqattn.DecodeWrapper(ws_d), gqattn.PrefillWrapper(ws_p)

    def plan(cache):
        dec.plan(cache.kv_page_indptr, cache.kv_last_page_len, 8, 2, head_dim, 16, dtype=dtype)
        pre.plan([0, 10, 30], cache.kv_page_indptr, 8, 2, head_dim, page_size=16,
                 kv_last_page_len=cache.kv_last_page_len, causal=True, dtype=dtype)

    def layer(q, qp, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len):
        d = dec.run(q, k_pages, v_pages, kv_page_indptr, kv_page_indices, kv_last_page_len)
        p = pre.run(qp, k_pages, v_pages, qo_indptr, kv_page_indptr, kv_page_indices, kv_last_page_len)
        return d.float() + 1, p * 2

    plan(cache)
    compiled = torch.compile(layer, fullgraph=True)
    got, want = compiled(q, qp, **t), layer(q, qp, **t)
    torch.testing.assert_close(got, want)
    cache2 = make_paged(rng, [77, 60], 2, head_dim, 16, "NHD", np.float32)  # pools of the same shape
    t2 = paged_torch(cache2, dtype, "cuda")
    plan(cache2)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got2 = compiled(q, qp, **t2)
    torch.testing.assert_close(got2, layer(q, qp, **t2))


@gpu
@needs_gpu
@pytest.mark.parametrize("graph_per_split,max_num_splits", [(False, 0), (True, 1)])
def test_gpu_cuda_graph_replays_after_replan(graph_per_split, max_num_splits):
    """Capture one decode in a CUDA graph, then re-plan with other lengths (same batch, workspace,
    enable_cuda_graph=True), write the new page table into the captured index tensors, replay.
    With graph_per_split and no split allowed, no plan splits and the graph holds no merge."""
    dtype, head_dim = built_gpu_variants()[0]
    rng = np.random.default_rng(16)
    page_size, num_pages, batch = 16, 96, 4
    k_pages = to_torch(rng.standard_normal((num_pages, page_size, 2, head_dim)), dtype, "cuda")
    v_pages = to_torch(rng.standard_normal((num_pages, page_size, 2, head_dim)), dtype, "cuda")
    q = to_torch(rng.standard_normal((batch, 8, head_dim)), dtype, "cuda")
    indptr_d = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_d = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_d = torch.zeros(batch, dtype=torch.int32, device="cuda")
    out = torch.zeros_like(q)
    wrapper = gqattn.DecodeWrapper(gqattn.make_workspace("cuda"))

    def plan_step(kv_lens):
        """Plans kv_lens, fills the captured index tensors, returns the host page table."""
        pages = [-(-n // page_size) for n in kv_lens]
        indptr = indptr_of(pages)
        ids = rng.permutation(num_pages)[:indptr[-1]].astype(np.int32)
        last = np.array([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)], np.int32)
        wrapper.plan(indptr, last, 8, 2, head_dim, page_size, dtype=dtype, enable_cuda_graph=True,
                     max_num_splits=max_num_splits, graph_per_split=graph_per_split)
        assert wrapper.plan_info.split == (not graph_per_split)
        indptr_d.copy_(torch.from_numpy(indptr))
        indices_d[:len(ids)].copy_(torch.from_numpy(ids))
        last_d.copy_(torch.from_numpy(last))
        return dict(kv_page_indptr=torch.from_numpy(indptr), kv_page_indices=torch.from_numpy(ids),
                    kv_last_page_len=torch.from_numpy(last))

    tables = plan_step([33, 700, 5, 128])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, k_pages, v_pages, indptr_d, indices_d, last_d, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, k_pages, v_pages, indptr_d, indices_d, last_d, out=out)
    for step in range(3):
        if step > 0:
            tables = plan_step([[1000, 1, 64, 17], [16, 16, 1400, 2]][step - 1])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = gqattn.decode(q.cpu(), k_pages.cpu(), v_pages.cpu(), **tables)
        torch.testing.assert_close(out.cpu().float(), ref.float(), **tol(dtype))


@gpu
@needs_gpu
def test_gpu_rejections():
    dtype, head_dim = built_gpu_variants()[0]
    wrapper, q, t = _decode_op_args(dtype, "cuda", head_dim)
    out = torch.full_like(q, 7.25)
    with pytest.raises(ValueError, match=r"^q: is on cpu but the plan is on cuda:0"):
        wrapper.run(q.cpu(), **t, out=out)
    with pytest.raises(ValueError, match=r"^kv_page_indices: is on cpu but the plan is on cuda:0"):
        wrapper.run(q, **dict(t, kv_page_indices=t["kv_page_indices"].cpu()), out=out)
    with pytest.raises(ValueError, match=r"^out: is on cpu but the plan is on cuda:0"):
        wrapper.run(q, **t, out=out.cpu())
    with pytest.raises(ValueError, match=r"^q: data pointer must be 16-byte aligned"):
        storage = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
        wrapper.run(storage[1:].view(q.shape), **t, out=out)
    torch.cuda.synchronize()
    assert torch.all(out == 7.25)
    ws = gqattn.make_workspace("cuda")
    with pytest.raises(ValueError, match=r"fp32 runs on the CPU backend only"):
        gqattn.DecodeWrapper(ws).plan([0, 1], [3], 8, 2, head_dim, 4, dtype="fp32")
    with pytest.raises(ValueError, match=r"head_dim 192 is not compiled for the GPU .*GQATTN_HEAD_DIMS"):
        gqattn.DecodeWrapper(ws).plan([0, 1], [3], 8, 2, 192, 4, dtype=dtype)
    with pytest.raises(ValueError, match=r"qo_len \(9\) must be in \[1, 8\] for a CUDA decode"):
        gqattn.DecodeWrapper(ws).plan([0, 2], [16], 8, 2, head_dim, 16, qo_len=9, dtype=dtype)
