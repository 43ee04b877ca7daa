"""gqattn as a Hugging Face transformers attention implementation: register() adds "gqattn" to
transformers' AttentionInterface (and a matching mask function), so that
`AutoModelForCausalLM.from_config(config, attn_implementation="gqattn")` runs its attention here.
Layer: python/ integrations (a client of gqattn.wrappers; imports torch and transformers).

Each call runs a ragged prefill: query [B, H, S, D] against key/value [B, Hkv, S_kv, D] (never
expanded per query head), causal aligned to the end of the KV, so prefill and decode steps with a
KV cache both work. Padding and custom masks are rejected with a ValueError. The plan is made on
the host at the first layer of each step and reused by the others, so the function itself is not
for torch.compile (the gqattn ops it calls are).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ..wrappers import PrefillWrapper, make_workspace

NAME = "gqattn"
_MAX_CACHED_PLANS = 8


class _Planner:
    """One PrefillWrapper per (device, problem shape): every layer of a step reuses the step's plan."""

    def __init__(self) -> None:
        self._workspaces: dict = {}
        self._plans: dict = {}

    def get(self, device: torch.device, key: tuple, batch: int, q_len: int, kv_len: int, num_qo_heads: int,
            num_kv_heads: int, head_dim: int, causal: bool, dtype: torch.dtype):
        entry = self._plans.get(key)
        if entry is not None:
            return entry
        if device.type == "cuda":
            workspace = self._workspaces.get(device)
            if workspace is None:
                workspace = self._workspaces[device] = make_workspace(device)
        else:
            workspace = None
        # A CUDA plan uploads into its workspace on the current stream: wrappers sharing one
        # workspace stay stream-ordered, but only the latest plan is valid, so keep one per device.
        if device.type == "cuda":
            self._plans = {k: v for k, v in self._plans.items() if k[0] != device}
        elif len(self._plans) >= _MAX_CACHED_PLANS:
            self._plans.pop(next(iter(self._plans)))
        wrapper = PrefillWrapper(workspace)
        qo_indptr = [b * q_len for b in range(batch + 1)]
        kv_indptr = [b * kv_len for b in range(batch + 1)]
        wrapper.plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, page_size=0, causal=causal,
                     dtype=dtype)
        entry = (
            wrapper,
            torch.tensor(qo_indptr, dtype=torch.int32, device=device),
            torch.tensor(kv_indptr, dtype=torch.int32, device=device),
        )
        self._plans[key] = entry
        return entry


_PLANNER = _Planner()


def _tokens_major(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, S, D] -> [B * S, heads, D] (a view when B == 1, else a copy)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def gqattn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function contract: returns (attn_output [B, S, H, D], None)."""
    if attention_mask is not None:
        raise ValueError(
            "gqattn: attention_mask is not supported: only unpadded batches with a plain causal (or full) "
            "mask run here; drop the padding (batch requests of equal length) or use attn_implementation='sdpa'")
    if dropout:
        raise ValueError(f"gqattn: dropout ({dropout}) is not supported (inference only; call model.eval())")
    for name in ("softcap", "sliding_window", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"gqattn: {name} is not supported")
    if kwargs.get("output_attentions"):
        raise ValueError("gqattn: output_attentions=True is not supported (attention weights are never formed)")
    batch, num_qo_heads, q_len, head_dim = query.shape
    _, num_kv_heads, kv_len, _ = key.shape
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    q = _tokens_major(query)
    k = _tokens_major(key)
    v = _tokens_major(value)
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    key_ = (query.device, batch, q_len, kv_len, num_qo_heads, num_kv_heads, head_dim, causal, query.dtype)
    wrapper, qo_indptr, kv_indptr = _PLANNER.get(query.device, key_, batch, q_len, kv_len, num_qo_heads,
                                                 num_kv_heads, head_dim, causal, query.dtype)
    out = wrapper.run(q, k, v, qo_indptr, kv_indptr, sm_scale=scaling)
    return out.view(batch, q_len, num_qo_heads, head_dim), None


def _gqattn_mask(**kwargs: Any) -> Optional[torch.Tensor]:
    """Mask function for "gqattn": None (gqattn's own causal / full mask) when there is no padding and
    the mask is plain causal or bidirectional; otherwise the sdpa mask, which the attention rejects."""
    from transformers import masking_utils

    plain = [getattr(masking_utils, n, None) for n in ("causal_mask_function", "bidirectional_mask_function")]
    padding = kwargs.get("attention_mask")
    no_padding = padding is None or bool(padding.all())
    if no_padding and kwargs.get("local_size") is None and kwargs.get("mask_function") in plain:
        return None
    return masking_utils.sdpa_mask(**kwargs)


def register(name: str = NAME) -> str:
    """Registers gqattn as transformers attention implementation `name` ("gqattn"); returns the name.
    Needs transformers with AttentionInterface and AttentionMaskInterface (4.53 or later)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(f"gqattn.integrations.transformers.register: needs transformers >= 4.53 ({e})") from e
    AttentionInterface.register(name, gqattn_attention_forward)
    AttentionMaskInterface.register(name, _gqattn_mask)
    return name
