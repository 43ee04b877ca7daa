"""Runs one PyTorch SDPA backend on one attention shape a few times, for ncu to profile one launch
(scripts/ncu_peer.sh): which kernel the peer launches, its grid, block, shared memory, registers
and pipe use, beside ours (scripts/ncu_decode.sh with NCU_KERNEL=attention_sm90_kernel).
Usage: python3 scripts/ncu_peer.py BACKEND HQ HKV D BATCH QO_LEN KV_LEN CAUSAL [ITERS]
  BACKEND: cudnn | flash | efficient. Inputs are random bf16, [B, H, L, D] contiguous. K/V keep
  HKV heads and SDPA runs with enable_gqa=True, as bench/peers.py times the peer (cuDNN reads them
  natively: in the decode tables it streams 32/4 heads at the read ceiling). NCU_PEER_EXPAND=1
  expands K/V to HQ heads first (what perf-notes item 176 profiled: another kernel, G times the
  bytes). For decode shapes (QO_LEN 1) pass CAUSAL 0: is_causal aligns to the top left."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main() -> None:
    if len(sys.argv) not in (9, 10):
        sys.exit(__doc__)
    backend = BACKENDS[sys.argv[1]]
    hq, hkv, d, b, qo, kv, causal = (int(x) for x in sys.argv[2:9])
    iters = int(sys.argv[9]) if len(sys.argv) == 10 else 8
    if hq % hkv:
        sys.exit("HQ must be a multiple of HKV")
    q = torch.randn(b, hq, qo, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, kv, d, device="cuda", dtype=torch.bfloat16)
    expand = os.environ.get("NCU_PEER_EXPAND") == "1"
    if expand:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    with sdpa_kernel([backend]):
        for _ in range(iters):
            F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=not expand)
    torch.cuda.synchronize()
    print(f"ran {iters} x {sys.argv[1]} Hq{hq}/Hkv{hkv} D{d} B{b} qo{qo} kv{kv} c{causal}"
          f" ({'K/V expanded' if expand else 'enable_gqa'})")


if __name__ == "__main__":
    main()
