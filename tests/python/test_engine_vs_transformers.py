"""gqattn-serve's forward pass against Hugging Face transformers' LlamaForCausalLM on the same
weights: a randomly initialised Llama with the engine's "tiny" dimensions is saved with
save_pretrained (safetensors, bf16: what the engine stores), loaded back into a float32
LlamaForCausalLM, and `gqattn-serve generate --device cpu --model tiny --weights DIR` (greedy)
runs prompts of 5, 17 and 33 random tokens with 1, 2 and 4 K/V heads (MQA, GQA, MHA; with
tied embeddings; with the "expand" attention backend). Without --model the engine takes the model
from the saved config.json: the same dimensions, and Llama-3.1's "llama3" RoPE scaling at theta
500000 (prompts of 300 tokens, so that the rescaled low frequencies turn far enough: at some
position unscaled RoPE at the same theta must put another token first). Transformers then runs once over prompt +
the engine's tokens, and at every generated position the engine's token must be transformers'
argmax up to a near-tie (its logit within TIE_TOL of the largest); most positions must be clear
(the two best logits more than TIE_TOL apart), so the comparison has power.
The engine prints no logits, so tokens are what is compared. The weights are drawn so that each
Llama convention matters to the tokens: sharp attention (RoPE pairing and theta), norm weights
away from 1 (RMSNorm weight placement), small embeddings (the RMSNorm eps of the first layer),
distinct gate and up projections, an lm_head other than the embedding (and one case tied).
Both sides run on the CPU in float32 (the engine accumulates in float64); nothing is downloaded.
The binary: $GQATTN_SERVE, else gqattn-serve in the build directory above a PYTHONPATH entry
(scripts/test.sh and gpu_check.sh pass $BUILD_DIR/python), else on PATH.
Layer: tests/python (skipped, with the reason shown, without torch, transformers, safetensors or
the binary).
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the engine-vs-transformers tests are skipped")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: the engine-vs-transformers tests are skipped")
safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="safetensors is not installed: the engine-vs-transformers tests are skipped")

# The engine's "tiny" preset (engine/config.cc); head_dim is given: hidden / heads is 64, not 128.
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            head_dim=128, max_position_embeddings=2048, rms_norm_eps=1e-5, hidden_act="silu",
            attention_bias=False, mlp_bias=False)
# LlamaConfig's RoPE arguments: unscaled at theta 10000; Llama-3.1-8B's config.json (theta, the
# "llama3" scaling, and max_position_embeddings, which transformers wants above the original 8192);
# the same unscaled, for the power check.
TINY_ROPE = dict(rope_theta=10000.0)
LLAMA31_UNSCALED = dict(rope_theta=500000.0, max_position_embeddings=131072)
LLAMA31_ROPE = dict(LLAMA31_UNSCALED, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
NEW_TOKENS = 24
# Both sides compute in float32 but sum in different orders; logits have a standard deviation
# of about 2 here.
TIE_TOL = 1e-3
# Of the generated positions of a case, at least this share must be clear of a near-tie.
MIN_CLEAR = 0.75
# Weight scales (uniform(0.5, 1.5) for the norms). q/k: attention scores of standard deviation
# about 2.5, so attention depends on position (RoPE). Embeddings: a mean square comparable to eps.
STD = {"embed_tokens": 0.005, "q_proj": 0.1, "k_proj": 0.1, "v_proj": 0.08, "o_proj": 0.08, "gate_proj": 0.08,
       "up_proj": 0.08, "down_proj": 0.08, "lm_head": 0.1}
TIED_EMBED_STD = 0.1  # the embedding is the lm_head too: logits need the larger scale

# (prompt length, K/V heads, tied embeddings, attention backend, seed, --model tiny given (else the
# model is config.json's), Llama-3.1's RoPE scaling)
CASES = [
    (5, 1, False, "gqattn", 1, True, False),
    (17, 2, False, "gqattn", 2, True, False),
    (33, 4, False, "gqattn", 3, True, False),
    (17, 2, True, "gqattn", 4, True, False),
    (33, 1, False, "expand", 5, True, False),
    (17, 2, False, "gqattn", 6, False, False),
    (300, 2, False, "gqattn", 7, False, True),
    (300, 1, True, "expand", 8, False, True),
]


def case_id(prompt_len, num_kv_heads, tied, attention, seed, preset, llama31):
    return (f"prompt{prompt_len}-kv{num_kv_heads}{'-tied' if tied else ''}-{attention}"
            f"{'' if preset else '-config'}{'-llama31' if llama31 else ''}")


def find_serve():
    """(path or None, the places looked at)."""
    tried = []
    env = os.environ.get("GQATTN_SERVE")
    if env:
        return (env if os.access(env, os.X_OK) else None), [f"$GQATTN_SERVE={env}"]
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        candidate = Path(entry).resolve().parent / "gqattn-serve"
        tried.append(str(candidate))
        if os.access(candidate, os.X_OK):
            return str(candidate), tried
    tried.append("PATH")
    return shutil.which("gqattn-serve"), tried


@pytest.fixture(scope="module")
def serve():
    path, tried = find_serve()
    if path is None:
        pytest.skip("gqattn-serve not found (looked at " + ", ".join(tried) + "; set GQATTN_SERVE): "
                    "the engine-vs-transformers tests are skipped")
    return path


def llama_config(num_kv_heads, tied, rope):
    config = transformers.LlamaConfig(num_key_value_heads=num_kv_heads, tie_word_embeddings=tied,
                                      **{**TINY, **rope})
    config._attn_implementation = "eager"
    return config


def init_weights(model, tied, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                kind = name.split(".")[-2]
                p.normal_(0.0, TIED_EMBED_STD if tied and kind == "embed_tokens" else STD[kind])


def expected_inv_freq(rope):
    """RoPE's inverse frequencies; with Llama-3.1's scaling, wavelengths above original / low_freq_factor
    divided by the factor, those below original / high_freq_factor kept, the band between interpolated."""
    head_dim = TINY["head_dim"]
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if "rope_scaling" not in rope:
        return inv_freq
    s = rope["rope_scaling"]
    original = s["original_max_position_embeddings"]
    wavelen = 2 * torch.pi / inv_freq
    smooth = (original / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    scaled = torch.where(wavelen > original / s["low_freq_factor"], inv_freq / s["factor"],
                         (1 - smooth) * inv_freq / s["factor"] + smooth * inv_freq)
    return torch.where(wavelen < original / s["high_freq_factor"], inv_freq, scaled)


def check_rope(model, rope):
    """The theta and the RoPE (unscaled, or Llama-3.1's) that transformers ended up with, whatever its
    version's way of passing rope_theta and the scaling."""
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return
    torch.testing.assert_close(rotary.inv_freq.double(), expected_inv_freq(rope), rtol=1e-6, atol=0)
    assert float(getattr(rotary, "attention_scaling", 1.0)) == 1.0


def load_reference(saved, num_kv_heads, tied, rope):
    """A float32 LlamaForCausalLM holding the saved tensors."""
    ref = transformers.LlamaForCausalLM(llama_config(num_kv_heads, tied, rope)).float().eval()
    missing, unexpected = ref.load_state_dict({k: v.float() for k, v in saved.items()}, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), missing
    if tied:
        assert torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)
    for name, value in saved.items():
        assert torch.equal(ref.state_dict()[name], value.float()), name
    check_rope(ref, rope)
    return ref


def make_checkpoint(directory, num_kv_heads, tied, seed, llama31):
    """Saves a random Llama (bf16) in `directory`; returns the float32 model holding the same values
    and, with Llama-3.1's RoPE, the same model with unscaled RoPE (else None)."""
    rope = LLAMA31_ROPE if llama31 else TINY_ROPE
    config = llama_config(num_kv_heads, tied, rope)
    model = transformers.LlamaForCausalLM(config)
    q_rows = model.model.layers[0].self_attn.q_proj.weight.shape[0]
    if q_rows != TINY["num_attention_heads"] * TINY["head_dim"]:
        pytest.skip(f"transformers {transformers.__version__} ignores LlamaConfig(head_dim=128) (q_proj has {q_rows} "
                    "rows): the engine-vs-transformers tests are skipped")
    init_weights(model, tied, seed)
    model.to(torch.bfloat16).save_pretrained(str(directory))
    files = sorted(Path(directory).glob("*.safetensors"))
    assert files, f"save_pretrained wrote no .safetensors file in {directory}: {os.listdir(directory)}"
    saved = {}
    for f in files:
        saved.update(safetensors_torch.load_file(str(f)))
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    assert ("lm_head.weight" in saved) == (not tied)
    unscaled = load_reference(saved, num_kv_heads, tied, LLAMA31_UNSCALED) if llama31 else None
    return load_reference(saved, num_kv_heads, tied, rope), unscaled


def engine_generate(serve, directory, prompt, num_kv_heads, attention, preset):
    model = ["--model", "tiny", "--num-kv-heads", str(num_kv_heads)] if preset else []
    cmd = [serve, "generate", "--device", "cpu", *model, "--attention", attention, "--weights", str(directory),
           "--prompt", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{' '.join(cmd)}\nexit {run.returncode}\n{run.stdout}\n{run.stderr}"
    tokens = [int(t) for t in run.stdout.split()]
    assert len(tokens) == NEW_TOKENS, run.stdout
    return tokens


def compare(ref, prompt, tokens):
    """Per generated position: (HF max logit - HF logit of the engine's token, HF top-2 gap)."""
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[0, len(prompt) - 1:].double()
    top2 = logits.topk(2, dim=-1).values
    taken = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    return (top2[:, 0] - taken).tolist(), (top2[:, 0] - top2[:, 1]).tolist(), logits.std().item()


@pytest.mark.parametrize("prompt_len,num_kv_heads,tied,attention,seed,preset,llama31", CASES,
                         ids=[case_id(*c) for c in CASES])
def test_greedy_tokens_match_transformers(serve, tmp_path, prompt_len, num_kv_heads, tied, attention, seed, preset,
                                          llama31):
    ref, unscaled = make_checkpoint(tmp_path, num_kv_heads, tied, seed, llama31)
    prompt = torch.randint(0, TINY["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    tokens = engine_generate(serve, tmp_path, prompt, num_kv_heads, attention, preset)
    behind, gaps, logit_std = compare(ref, prompt, tokens)
    report = "\n".join(f"  position {i}: engine token {t}, behind HF's best by {b:.3g}, HF top-2 gap {g:.3g}"
                       for i, (t, b, g) in enumerate(zip(tokens, behind, gaps)))
    bad = [i for i, b in enumerate(behind) if b > TIE_TOL]
    assert not bad, (f"prompt {prompt}: the engine's token is not transformers' argmax (beyond a near-tie of "
                     f"{TIE_TOL}) at generated positions {bad} (logit std {logit_std:.3g}):\n{report}")
    clear = sum(g > TIE_TOL for g in gaps)
    assert clear >= MIN_CLEAR * len(gaps), f"only {clear} of {len(gaps)} positions are clear of a near-tie:\n{report}"
    if unscaled is not None:
        # The scaling matters: unscaled RoPE at the same theta puts another token first somewhere.
        unscaled_behind, _, _ = compare(unscaled, prompt, tokens)
        assert max(unscaled_behind) > TIE_TOL, ("with unscaled RoPE transformers would pick the engine's tokens too "
                                                f"(behind by at most {max(unscaled_behind):.3g}): no power")
