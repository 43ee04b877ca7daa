"""Type stubs of gqattn._C, the nanobind bindings of the C++ API (python/src/module.cc).
Layer: python/. Tensors are any DLPack producer (torch, numpy, cupy, jax); `stream` is a
cudaStream_t as an integer (0: the default stream; ignored on the CPU).
"""

from typing import Any, Optional, Sequence, Tuple

kRecommendedWorkspaceBytes: int

class Plan:
    """What decode_plan / prefill_plan decided; pass it to the matching run."""

    @property
    def device(self) -> str: ...
    @property
    def device_id(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def batch(self) -> int: ...
    @property
    def num_qo_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def num_pages(self) -> int: ...  # checked mode's pool size (run() rejects smaller pools); else -1
    @property
    def causal(self) -> bool: ...
    @property
    def is_decode(self) -> bool: ...
    @property
    def total_qo(self) -> int: ...
    @property
    def qo_indptr(self) -> list[int]: ...
    @property
    def kv_len(self) -> list[int]: ...
    @property
    def kernel_id(self) -> int: ...
    @property
    def cta_rows(self) -> int: ...
    @property
    def kv_chunk(self) -> int: ...
    @property
    def num_work(self) -> int: ...
    @property
    def num_ctas(self) -> int: ...
    @property
    def max_splits(self) -> int: ...
    @property
    def split(self) -> bool: ...
    @property
    def workspace_bytes_used(self) -> int: ...

def decode_plan(
    workspace: Optional[Any],
    kv_page_indptr: Sequence[int],
    kv_last_page_len: Sequence[int],
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    qo_len: int = 1,
    dtype: str = "bf16",
    enable_cuda_graph: bool = False,
    max_num_splits: int = 0,
    kv_page_indices: Sequence[int] = ...,
    num_pages: int = -1,
    stream: int = 0,
    graph_per_split: bool = False,
    fixed_split_size: int = 0,
) -> Plan: ...
def prefill_plan(
    workspace: Optional[Any],
    qo_indptr: Sequence[int],
    kv_indptr: Sequence[int],
    kv_last_page_len: Sequence[int],
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    causal: bool = False,
    dtype: str = "bf16",
    enable_cuda_graph: bool = False,
    max_num_splits: int = 0,
    kv_page_indices: Sequence[int] = ...,
    num_pages: int = -1,
    stream: int = 0,
    graph_per_split: bool = False,
    fixed_split_size: int = 0,
) -> Plan: ...
def decode_run(
    plan: Plan,
    q: Any,
    k_pages: Any,
    v_pages: Any,
    kv_page_indptr: Any,
    kv_page_indices: Any,
    kv_last_page_len: Any,
    out: Any,
    lse: Optional[Any] = None,
    kv_layout: str = "NHD",
    sm_scale: float = 0.0,
    stream: int = 0,
) -> None: ...
def prefill_run_paged(
    plan: Plan,
    q: Any,
    qo_indptr: Any,
    k: Any,
    v: Any,
    kv_indptr: Any,
    kv_page_indices: Any,
    kv_last_page_len: Any,
    out: Any,
    lse: Optional[Any] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    sm_scale: float = 0.0,
    stream: int = 0,
) -> None: ...
def prefill_run_ragged(
    plan: Plan,
    q: Any,
    qo_indptr: Any,
    k: Any,
    v: Any,
    kv_indptr: Any,
    out: Any,
    lse: Optional[Any] = None,
    causal: bool = False,
    sm_scale: float = 0.0,
    stream: int = 0,
) -> None: ...
def append_kv(
    k_pages: Any,
    v_pages: Any,
    kv_page_indptr: Any,
    kv_page_indices: Any,
    kv_last_page_len: Optional[Any],
    k_new: Any,
    v_new: Any,
    batch_indices: Any,
    positions: Any,
    kv_layout: str = "NHD",
    stream: int = 0,
) -> None: ...
def merge_states(v: Any, s: Any, v_merged: Any, s_merged: Optional[Any] = None, stream: int = 0) -> None: ...
def block_table_to_csr(
    pages: Sequence[int], batch: int, max_pages: int, kv_len: Sequence[int], page_size: int
) -> Tuple[list[int], list[int], list[int]]: ...
def csr_to_block_table(
    kv_page_indptr: Sequence[int], kv_page_indices: Sequence[int], kv_last_page_len: Sequence[int], page_size: int
) -> Tuple[list[int], int, int, list[int]]: ...
def build_info() -> dict[str, Any]: ...
def cuda_device_count() -> int: ...
