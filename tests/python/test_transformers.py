"""gqattn as a Hugging Face transformers attention implementation: a small randomly initialised
Llama (GQA: 8 query heads, 2 KV heads) generates the same greedy tokens with
attn_implementation="gqattn" as with "sdpa" (prefill, then decode steps with a KV cache), a chunk
with a cache agrees (causal aligned to the end of the KV), and padding masks are rejected.
On the CPU in fp32 the tokens must be identical; on the GPU (marked gpu) in bf16 they must be
identical up to any step where sdpa's own two best logits are within bf16 noise (a near-tie that
either implementation may break either way), and the logits must agree up to there.
Layer: tests/python (skipped, with the reason shown, without torch or transformers).
"""

import inspect

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the transformers tests are skipped")
transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed: the transformers tests are skipped")

import gqattn  # noqa: E402
from gqattn.integrations import transformers as gqattn_hf  # noqa: E402

NEW_TOKENS = 32
# bf16 bounds, from the CPU backend against CPU sdpa in bf16 on this model (largest logit difference
# about 0.01 with logits of standard deviation 0.33); a wrong mask or head mapping moves logits by
# about the standard deviation.
LOGIT_TOL_BF16 = 0.05
TIE_TOL_BF16 = 0.05


def has_gpu():
    return torch.cuda.is_available() and gqattn.build_info()["cuda"] and gqattn.cuda_device_count() > 0


@pytest.fixture(scope="module", autouse=True)
def registered():
    try:
        return gqattn_hf.register()
    except ImportError as e:
        pytest.skip(str(e))


def make_model(dtype, device):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, vocab_size=1000, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def use(model, impl):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


def greedy(model, impl, ids):
    """(new tokens [B, NEW_TOKENS], their logits [B, NEW_TOKENS, vocab] in fp32)."""
    use(model, impl)
    with torch.no_grad():
        result = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                return_dict_in_generate=True, pad_token_id=0)
    return result.sequences[:, ids.shape[1]:], torch.stack(result.logits, dim=1).float()


def compare_greedy(ref, got, logit_tol, tie_tol):
    """Tokens equal up to the first near-tie of the reference; logits within logit_tol up to there."""
    (ref_tokens, ref_logits), (got_tokens, got_logits) = ref, got
    for b in range(ref_tokens.shape[0]):
        differs = (ref_tokens[b] != got_tokens[b]).nonzero()
        end = int(differs[0]) if len(differs) else ref_tokens.shape[1]
        seen = min(end + 1, ref_tokens.shape[1])  # both saw the same prefix up to and including `end`
        worst = (ref_logits[b, :seen] - got_logits[b, :seen]).abs().max().item()
        assert worst <= logit_tol, f"row {b}: logits differ by {worst} (> {logit_tol}) within the common prefix"
        if end < ref_tokens.shape[1]:
            step = ref_logits[b, end]
            gap = (step[ref_tokens[b, end]] - step[got_tokens[b, end]]).item()
            assert gap <= tie_tol, (f"row {b}: tokens diverge at step {end} where sdpa prefers its token by "
                                    f"{gap} (> {tie_tol}): not a near-tie")


def with_cache(model, ids, cache):
    """model(ids) continuing `cache` (transformers renamed past_key_values to cache)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return model(ids, use_cache=True, **{name: cache})


def cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def forced_decode_logits(model, impl, ids, tokens):
    """Logits of each decode step when both implementations are fed the same tokens (teacher forcing):
    a prefill of ids with a KV cache, then one step per token of tokens [B, T]."""
    use(model, impl)
    logits = []
    with torch.no_grad():
        step = model(ids, use_cache=True)
        for t in range(tokens.shape[1]):
            logits.append(step.logits[:, -1].float())
            step = with_cache(model, tokens[:, t:t + 1], cache_of(step))
    return torch.stack(logits, dim=1)


def chunk_logits(model, impl, ids, split):
    """Logits of ids[:, split:] computed with a KV cache holding ids[:, :split]."""
    use(model, impl)
    with torch.no_grad():
        first = model(ids[:, :split], use_cache=True)
        return with_cache(model, ids[:, split:], cache_of(first)).logits.float()


def test_cpu_fp32_greedy_tokens_identical():
    model = make_model(torch.float32, "cpu")
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    ref = greedy(model, "sdpa", ids)
    got = greedy(model, "gqattn", ids)
    assert torch.equal(ref[0], got[0]), f"sdpa {ref[0].tolist()}\ngqattn {got[0].tolist()}"
    torch.testing.assert_close(got[1], ref[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(forced_decode_logits(model, "gqattn", ids, ref[0]),
                               forced_decode_logits(model, "sdpa", ids, ref[0]), atol=1e-4, rtol=1e-4)


def test_cpu_fp32_chunk_with_cache_is_end_aligned():
    model = make_model(torch.float32, "cpu")
    ids = torch.randint(0, 1000, (1, 27), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(chunk_logits(model, "gqattn", ids, 20), chunk_logits(model, "sdpa", ids, 20),
                               atol=1e-4, rtol=1e-4)


def test_padding_mask_is_rejected():
    model = make_model(torch.float32, "cpu")
    use(model, "gqattn")
    ids = torch.randint(0, 1000, (2, 8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad(), pytest.raises(ValueError, match="gqattn: attention_mask is not supported"):
        model(ids, attention_mask=mask)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="GPU tests need torch.cuda.is_available() and gqattn built with CUDA")
def test_gpu_bf16_greedy_tokens_match_sdpa():
    info = gqattn.build_info()
    if "bf16" not in info["dtypes"] or 64 not in info["head_dims"]:
        pytest.skip("bf16 head_dim 64 is not compiled in this build (GQATTN_DTYPES / GQATTN_HEAD_DIMS)")
    model = make_model(torch.bfloat16, "cuda")
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1)).cuda()
    ref = greedy(model, "sdpa", ids)
    got = greedy(model, "gqattn", ids)
    compare_greedy(ref, got, logit_tol=LOGIT_TOL_BF16, tie_tol=TIE_TOL_BF16)
    # Every decode step, past any near-tie: both fed sdpa's tokens.
    forced = forced_decode_logits(model, "gqattn", ids, ref[0])
    torch.testing.assert_close(forced, forced_decode_logits(model, "sdpa", ids, ref[0]), atol=LOGIT_TOL_BF16,
                               rtol=0)
    chunk = chunk_logits(model, "gqattn", ids[:1], 10)
    torch.testing.assert_close(chunk, chunk_logits(model, "sdpa", ids[:1], 10), atol=LOGIT_TOL_BF16, rtol=0)
