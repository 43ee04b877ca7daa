// Thin typed wrappers over the sm_90a PTX of the Hopper attention path: mbarriers (with cp.async
// arrival), TMA loads, thread-block clusters (multicast, remote arrivals; wip/gemm_stream's), the
// async-proxy fence, wgmma shared-memory descriptors and fences, setmaxnreg and
// named barriers. The wgmma instructions themselves are in wgmma_ops.cuh (generated).
// Layer: src/prims (device only; callers compile these only for sm_90a, see attention_sm90.cuh).
#pragma once

#include <cstdint>

#include "prims/mma.cuh"

namespace gqattn::prims::sm90 {

// ---- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr(bar))
               : "memory");
}
// The barrier counts one arrival of this thread once all of its earlier cp.async copies have
// landed (the arrival is pre-counted in the barrier's expected count: .noinc).
__device__ __forceinline__ void mbar_arrive_on_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Blocks until the phase of parity `parity` has completed (a fresh barrier counts its phase
// "parity 1" as complete, so producers start waiting on the empty barriers with parity 1).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Arrival that also announces `bytes` of TMA transactions the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// TMA tile loads into shared memory (box and swizzle from the tensor map), completing as
// transaction bytes on `bar`. `tmap` is the address of a __grid_constant__ CUtensorMap.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tmap, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tmap, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// A contiguous copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory, completing as transaction bytes on `bar` (no tensor map: one page of a paged
// cache, say).
__device__ __forceinline__ void bulk_load_1d(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// ---- thread-block clusters ---------------------------------------------------------------------
// tma_load_2d's box written to `dst` of every CTA of the cluster in `mask` (cluster ranks), each
// one's barrier at `bar`'s offset counting the bytes that land in it.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tmap, uint64_t* bar, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}
// One arrival on the barrier at `bar`'s offset in the shared memory of cluster rank `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}
// mbar_wait acquiring at cluster scope: for arrivals from the cluster's other CTAs (e.g. their
// consumers freeing a stage that this CTA's multicast refills in all of them).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Every thread of every CTA of the cluster (divergent threads allowed) arrives and waits.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Makes this thread's view of shared memory (here: data that cp.async wrote, observed through an
// mbarrier) visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Four 8 x 8 matrices of 16-bit values from a warp's mma fragments to shared memory (stmatrix,
// sm_90): r[k] is this lane's fragment of matrix k (row lane / 4, columns 2 (lane % 4) and + 1), and
// lanes 8 k .. 8 k + 7 give the shared-state-space addresses of matrix k's rows 0..7 (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t smem, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// A TMA tile store from shared memory (box and swizzle from the tensor map) in the thread's bulk
// async-group; the shared memory must stay untouched until bulk_wait_read says it was read (after
// fence_proxy_async_smem by every thread that wrote it, and a barrier).
__device__ __forceinline__ void tma_store_3d(const void* tmap, uint32_t smem, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's committed bulk groups still read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// ---- warp uniformity --------------------------------------------------------------------------
// Lane 0's value, through a shuffle: the compiler then treats it as the same in every lane. A loop
// or branch on a plain shared-memory load counts as divergent, and everything after it loses the
// uniform datapath (descriptors and base pointers in uniform registers) and gets a divergence check
// before every shuffle (SASS of the prefill kernel: 8 BRA.DIV and 48 ENDCOLLECTIVE without this).
// The warp must be converged.
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// ---- warpgroup control ------------------------------------------------------------------------
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Named barrier `id` (1..15; 0 is __syncthreads) completing when `threads` threads arrived:
// sync (prims::named_barrier_sync, mma.cuh) waits for it, arrive only counts this warp in.
using prims::named_barrier_sync;
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// named_barrier_arrive once `dep` is computed: ptxas orders a barrier only against memory
// operations, so it may move register arithmetic (a softmax's exponentials) past a plain arrive.
// The barrier id is made to depend on `dep` (min(id, id | dep) == id), in PTX that the front end
// cannot fold.
__device__ __forceinline__ void named_barrier_arrive_after(uint32_t id, uint32_t threads, uint32_t dep) {
  asm volatile("{\n\t.reg .b32 t, b;\n\tor.b32 t, %0, %2;\n\tmin.u32 b, %0, t;\n\tbar.arrive b, %1;\n}\n" ::"r"(id),
               "r"(threads), "r"(dep)
               : "memory");
}
// Named barrier `id` over `threads` threads that also ORs `pred` over them: the same answer in
// every thread (e.g. a branch taken by a whole warpgroup or by none of it). `id` must be one that
// no thread syncs or arrives on meanwhile: a bar.red beside a bar.sync / bar.arrive on the same
// barrier is undefined in PTX, and traps on the H100 (docs/perf-notes.md item 300).
__device__ __forceinline__ bool named_barrier_any(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\tbar.red.or.pred q, %2, %3, p;\n\t"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// ---- wgmma ------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// The same wait, spelt differently: the compiler does not merge it with a wgmma_wait<kPending> in
// the other arm of a branch (hoisting the pair above the branch), so a wait can be kept behind
// work that must run before it (ptxas issues a wait first in its basic block: perf-notes item 140).
// Every warp of the warpgroup must take the same arm (a branch on named_barrier_any), else the
// warps wait at different instructions (compute-sanitizer: "Mismatching warpgroup instruction pc").
template <int kPending>
__device__ __forceinline__ void wgmma_wait_alt() {
  asm volatile("{\n\twgmma.wait_group.sync.aligned %0;\n}\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator register across wgmma
// fences/waits (the asm above does not name the registers).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor for the 128-byte swizzle: the operand is stored as column
// blocks of 64 16-bit elements (128-byte rows), 8-row atoms of 1024 bytes, 1024-byte aligned.
//   K-major operand (Q, K: rows = M or N, contiguous = K): lbo unused (16).
//   MN-major operand (V read as B = [keys][head_dim], contiguous = N): lbo = the byte distance
//   between column blocks.
// The stride byte offset is the atom's 1024 bytes in both, so the high word (sbo >> 4, the
// swizzle mode in bit 62) is a constant. Offsets (16-byte units) go to the low word only: its 14
// address bits hold any shared-memory address (< 256 KB), so they never carry into lbo. A 64-bit
// add per wgmma cost a carry and a copy (perf-notes item 131).
struct SmemDesc {
  static constexpr uint32_t kHi = (1024u >> 4) | (1u << 30);
  uint32_t lo;
  __device__ __forceinline__ SmemDesc operator+(uint32_t units) const { return {lo + units}; }
  // The descriptor `units` further on, computed where it is used: an asm the compiler may not
  // hoist. Left to the compiler, the adds of every k-step moved ahead of the loop's turn barrier,
  // held registers (hd256 spilled 200 bytes) and measured slower (perf-notes item 131).
  __device__ __forceinline__ uint64_t at(uint32_t units) const {
    uint64_t d;
    asm volatile("{\n.reg .b32 t;\nadd.u32 t, %1, %2;\nmov.b64 %0, {t, %3};\n}\n" : "=l"(d) : "r"(lo), "r"(units), "n"(kHi));
    return d;
  }
};
__device__ __forceinline__ SmemDesc smem_desc_sw128(const void* p, uint32_t lbo_bytes) {
  return {((smem_addr(p) & 0x3FFFF) >> 4) | (((lbo_bytes & 0x3FFFF) >> 4) << 16)};
}

}  // namespace gqattn::prims::sm90
