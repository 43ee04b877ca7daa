"""gqattn: grouped-query attention over a paged KV cache (decode, prefill, append_kv, merge_states)
for any DLPack tensor: CPU tensors run on the float64 CPU backend, CUDA tensors on the GPU kernels.
Layer: python/ (the package's public names). gqattn.ops (torch custom ops) loads on first use with
torch tensors; gqattn.integrations.transformers registers gqattn with Hugging Face transformers.
"""

from .wrappers import (
    DecodeWrapper,
    PrefillWrapper,
    append_kv,
    block_table_to_csr,
    build_info,
    csr_to_block_table,
    cuda_device_count,
    decode,
    kRecommendedWorkspaceBytes,
    make_workspace,
    merge_states,
    prefill,
)

__version__ = "0.1.0"

__all__ = [
    "DecodeWrapper",
    "PrefillWrapper",
    "append_kv",
    "block_table_to_csr",
    "build_info",
    "csr_to_block_table",
    "cuda_device_count",
    "decode",
    "kRecommendedWorkspaceBytes",
    "make_workspace",
    "merge_states",
    "prefill",
]
