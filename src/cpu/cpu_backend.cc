// The CPU backend's attention, append_kv and merge_states: float64 accumulation, plain loops (the
// attention's rows spread over threads where the call is large: the same bits on any count).
// Layer: src/cpu (host-only). Inputs are validated by src/api before they reach this file, so
// every page id and length here is known to be in range.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "api/host_float.h"
#include "gqattn/error.h"

namespace gqattn::cpu {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One request's keys and values for one K/V head, densely: row j holds key j.
struct HeadKV {
  int64_t kv_len = 0;
  int64_t head_dim = 0;
  std::vector<double> k;  // [kv_len, head_dim]
  std::vector<double> v;  // [kv_len, head_dim]
};

// Fills `out` with request b's keys and values of K/V head g.
using GatherFn = std::function<void(int b, int g, HeadKV& out)>;

// Element offset of key j of request b, K/V head g, dim 0, in a page pool with the given strides.
int64_t paged_offset(const PagedKV& kv, const TensorView& pool, int b, int64_t j, int g) {
  const int32_t* indptr = kv.kv_page_indptr.ptr<int32_t>();
  const int32_t* indices = kv.kv_page_indices.ptr<int32_t>();
  const int64_t page_size = kv.page_size();
  const int64_t page = indices[indptr[b] + j / page_size];
  const int64_t row = j % page_size;
  if (kv.layout == KVLayout::kHND)
    return page * pool.strides[0] + g * pool.strides[1] + row * pool.strides[2];
  return page * pool.strides[0] + row * pool.strides[1] + g * pool.strides[2];
}

GatherFn gather_paged(const PagedKV& kv, const Plan& plan) {
  return [&kv, &plan](int b, int g, HeadKV& out) {
    out.kv_len = plan.kv_len[b];
    out.head_dim = plan.head_dim;
    out.k.resize(size_t(out.kv_len * out.head_dim));
    out.v.resize(size_t(out.kv_len * out.head_dim));
    for (int64_t j = 0; j < out.kv_len; ++j) {
      const int64_t ko = paged_offset(kv, kv.k_pages, b, j, g);
      const int64_t vo = paged_offset(kv, kv.v_pages, b, j, g);
      for (int64_t d = 0; d < out.head_dim; ++d) {
        out.k[j * out.head_dim + d] = load_as_double(kv.k_pages.data, kv.k_pages.dtype, ko + d);
        out.v[j * out.head_dim + d] = load_as_double(kv.v_pages.data, kv.v_pages.dtype, vo + d);
      }
    }
  };
}

GatherFn gather_ragged(const RaggedKV& kv, const Plan& plan) {
  return [&kv, &plan](int b, int g, HeadKV& out) {
    const int64_t first = kv.kv_indptr.ptr<int32_t>()[b];
    out.kv_len = plan.kv_len[b];
    out.head_dim = plan.head_dim;
    out.k.resize(size_t(out.kv_len * out.head_dim));
    out.v.resize(size_t(out.kv_len * out.head_dim));
    for (int64_t j = 0; j < out.kv_len; ++j) {
      const int64_t ko = (first + j) * kv.k.strides[0] + g * kv.k.strides[1];
      const int64_t vo = (first + j) * kv.v.strides[0] + g * kv.v.strides[1];
      for (int64_t d = 0; d < out.head_dim; ++d) {
        out.k[j * out.head_dim + d] = load_as_double(kv.k.data, kv.k.dtype, ko + d);
        out.v[j * out.head_dim + d] = load_as_double(kv.v.data, kv.v.dtype, vo + d);
      }
    }
  };
}

// Rows [row_begin, row_end) of request b's packed rows under K/V head g (packed row r: query head
// g * group_size + r / qo_len, query token r % qo_len), computed by one task.
struct Task {
  int b = 0, g = 0;
  int64_t row_begin = 0, row_end = 0;
};

constexpr int64_t kTaskRows = 16;
// Rows computed together: each key's and value's row is read once for all of them, and their dot
// products are independent sums (each in the same order as one row alone: the same bits).
constexpr int kBlockRows = 4;
// Multiply-adds below which a call stays on the calling thread (threads cost ~50 us each to start).
constexpr double kParallelWork = double(1 << 22);
// Each thread gathers its own copy of a (request, K/V head)'s keys and values in float64: no more
// threads than keep those copies within this many bytes.
constexpr double kScratchBytes = double(1ull << 30);

// Threads of the CPU backend: GQATTN_CPU_THREADS, else the hardware's.
int cpu_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("GQATTN_CPU_THREADS")) {
      const int n = std::atoi(env);
      if (n >= 1) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(std::min(hw, 256u));
  }();
  return threads;
}

// One thread's buffers: the K/V of the (request, K/V head) it last gathered, and a block's query
// rows, logits and accumulators.
struct Scratch {
  int b = -1, g = -1;
  HeadKV kv;
  std::vector<double> q, logits, acc;
};

// fn(task, scratch) for tasks 0 .. num_tasks - 1, claimed in order by `threads` threads (the
// calling one among them). Every output row is written by one task in a fixed order, so the
// results do not depend on the thread count. Each thread's scratch is allocated by prepare(scratch)
// before any task runs: a call too large for the host's memory throws before it writes anything.
template <typename Prepare, typename Fn>
void run_tasks(size_t num_tasks, size_t threads, const Prepare& prepare, const Fn& fn) {
  threads = std::max<size_t>(1, std::min(threads, num_tasks));
  std::vector<Scratch> scratch(threads);
  for (Scratch& s : scratch) prepare(s);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&](Scratch& own) {
    try {
      for (size_t t = next++; t < num_tasks; t = next++) fn(t, own);
    } catch (...) {
      next = num_tasks;
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  // A thread that cannot start (std::system_error at a thread or memory limit, which concurrent
  // callers each starting their own helpers can reach) leaves its tasks to those running: the same
  // bits on any count. Letting the exception out would end the process once a helper runs.
  std::vector<std::thread> pool;
  pool.reserve(threads);  // no reallocation (which could throw) once a thread runs
  for (size_t i = 1; i < threads; ++i) {
    try {
      pool.emplace_back(worker, std::ref(scratch[i]));
    } catch (...) {
      break;
    }
  }
  worker(scratch[0]);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// The attention of every request of the plan; K/V come from `gather`.
void attend(const Plan& plan, const TensorView& q, const TensorView& o, const TensorView& lse,
            float sm_scale, bool causal, const GatherFn& gather) {
  const int64_t head_dim = plan.head_dim;
  const int group_size = plan.num_qo_heads / plan.num_kv_heads;
  const double scale = sm_scale == 0.f ? 1.0 / std::sqrt(double(head_dim)) : double(sm_scale);
  std::vector<Task> tasks;
  double work = 0.0, longest = 0.0;
  for (int b = 0; b < plan.batch; ++b) {
    const int64_t rows = int64_t(plan.qo_indptr[b + 1] - plan.qo_indptr[b]) * group_size;
    for (int g = 0; g < plan.num_kv_heads; ++g)
      for (int64_t r = 0; r < rows; r += kTaskRows) tasks.push_back(Task{b, g, r, std::min(r + kTaskRows, rows)});
    work += double(rows) * plan.num_kv_heads * double(plan.kv_len[b]) * double(head_dim);
    if (rows > 0) longest = std::max(longest, double(plan.kv_len[b]));
  }
  const double scratch_bytes = 2.0 * longest * double(head_dim) * sizeof(double);
  const size_t threads = work < kParallelWork ? 1
                         : static_cast<size_t>(std::max(1.0, std::min(double(cpu_threads()), kScratchBytes / std::max(scratch_bytes, 1.0))));

  // Each thread's buffers at their largest: the longest request's K/V in float64, a block's rows.
  auto prepare = [&](Scratch& s) {
    try {
      s.kv.k.reserve(size_t(longest) * size_t(head_dim));
      s.kv.v.reserve(size_t(longest) * size_t(head_dim));
      s.logits.reserve(size_t(kBlockRows) * size_t(longest));
      s.q.reserve(size_t(kBlockRows * head_dim));
      s.acc.reserve(size_t(kBlockRows * head_dim));
    } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
      throw Error(detail::concat("the CPU backend could not allocate ", int64_t(scratch_bytes),
                                 " bytes of float64 K/V for a request of ", int64_t(longest),
                                 " keys (it copies each request's K/V of one head as float64); nothing was written"));
    }
  };
  run_tasks(tasks.size(), threads, prepare, [&](size_t index, Scratch& s) {
    const Task& task = tasks[index];
    if (s.b != task.b || s.g != task.g) {
      gather(task.b, task.g, s.kv);
      s.b = task.b;
      s.g = task.g;
    }
    const HeadKV& kv = s.kv;
    const int64_t qo_begin = plan.qo_indptr[task.b];
    const int64_t qo_len = plan.qo_indptr[task.b + 1] - qo_begin;
    s.q.assign(size_t(kBlockRows * head_dim), 0.0);
    s.acc.resize(size_t(kBlockRows * head_dim));
    s.logits.resize(size_t(kBlockRows * kv.kv_len));
    for (int64_t r0 = task.row_begin; r0 < task.row_end; r0 += kBlockRows) {
      const int n = static_cast<int>(std::min<int64_t>(kBlockRows, task.row_end - r0));
      int64_t token[kBlockRows] = {}, head[kBlockRows] = {}, visible[kBlockRows] = {}, most = 0;
      for (int x = 0; x < n; ++x) {
        const int64_t i = (r0 + x) % qo_len;
        token[x] = qo_begin + i;
        head[x] = task.g * int64_t(group_size) + (r0 + x) / qo_len;
        // Causal: token i is key kv_len - qo_len + i of its request and sees keys up to it.
        visible[x] = causal ? std::clamp<int64_t>(kv.kv_len - qo_len + i + 1, 0, kv.kv_len) : kv.kv_len;
        most = std::max(most, visible[x]);
        const int64_t q_off = token[x] * q.strides[0] + head[x] * q.strides[1];
        for (int64_t d = 0; d < head_dim; ++d) s.q[size_t(x * head_dim + d)] = load_as_double(q.data, q.dtype, q_off + d);
      }
      // Logits of keys j < most for every row of the block (past a row's own visible keys unused).
      for (int64_t j = 0; j < most; ++j) {
        const double* key = kv.k.data() + j * head_dim;
        double dot[kBlockRows] = {};
        for (int64_t d = 0; d < head_dim; ++d)
          for (int x = 0; x < kBlockRows; ++x) dot[x] += s.q[size_t(x * head_dim + d)] * key[d];
        for (int x = 0; x < kBlockRows; ++x) s.logits[size_t(x * kv.kv_len + j)] = scale * dot[x];
      }
      double max_logit[kBlockRows], denom[kBlockRows];
      for (int x = 0; x < n; ++x) {
        max_logit[x] = kNegInf;
        for (int64_t j = 0; j < visible[x]; ++j) max_logit[x] = std::max(max_logit[x], s.logits[size_t(x * kv.kv_len + j)]);
        denom[x] = 0.0;
      }
      std::fill(s.acc.begin(), s.acc.end(), 0.0);
      for (int64_t j = 0; j < most; ++j) {
        const double* value = kv.v.data() + j * head_dim;
        for (int x = 0; x < n; ++x) {
          if (j >= visible[x]) continue;
          const double p = std::exp(s.logits[size_t(x * kv.kv_len + j)] - max_logit[x]);
          denom[x] += p;
          double* acc = s.acc.data() + x * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * value[d];
        }
      }
      for (int x = 0; x < n; ++x) {
        double* acc = s.acc.data() + x * head_dim;
        double lse_value = kNegInf;
        if (visible[x] > 0) {
          for (int64_t d = 0; d < head_dim; ++d) acc[d] /= denom[x];
          lse_value = max_logit[x] + std::log(denom[x]);
        }
        const int64_t o_off = token[x] * o.strides[0] + head[x] * o.strides[1];
        for (int64_t d = 0; d < head_dim; ++d) store_from_double(o.data, o.dtype, o_off + d, acc[d]);
        if (lse.defined()) {
          store_from_double(lse.data, DType::kFP32, token[x] * lse.strides[0] + head[x] * lse.strides[1], lse_value);
        }
      }
    }
  });
}

}  // namespace

void decode(const Plan& plan, const DecodeArgs& args) {
  attend(plan, args.q, args.o, args.lse, args.sm_scale, /*causal=*/true,
         gather_paged(args.kv, plan));
}

void prefill(const Plan& plan, const PrefillArgs& args) {
  const GatherFn gather =
      args.paged.defined() ? gather_paged(args.paged, plan) : gather_ragged(args.ragged, plan);
  attend(plan, args.q, args.o, args.lse, args.sm_scale, plan.causal, gather);
}

void append_kv(const PagedKV& kv, const TensorView& k_new, const TensorView& v_new,
               const TensorView& batch_indices, const TensorView& positions) {
  const int64_t tokens = k_new.shape[0];
  const int64_t heads = kv.num_kv_heads();
  const size_t row_bytes = size_t(kv.head_dim()) * dtype_size(kv.k_pages.dtype);
  const int32_t* bidx = batch_indices.ptr<int32_t>();
  const int32_t* pos = positions.ptr<int32_t>();
  const int64_t elem = int64_t(dtype_size(kv.k_pages.dtype));
  auto* k_pool = static_cast<char*>(kv.k_pages.data);
  auto* v_pool = static_cast<char*>(kv.v_pages.data);
  const auto* k_src = static_cast<const char*>(k_new.data);
  const auto* v_src = static_cast<const char*>(v_new.data);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int g = 0; g < heads; ++g) {
      const int64_t k_dst = paged_offset(kv, kv.k_pages, bidx[t], pos[t], g);
      const int64_t v_dst = paged_offset(kv, kv.v_pages, bidx[t], pos[t], g);
      std::memcpy(k_pool + k_dst * elem, k_src + (t * k_new.strides[0] + g * k_new.strides[1]) * elem,
                  row_bytes);
      std::memcpy(v_pool + v_dst * elem, v_src + (t * v_new.strides[0] + g * v_new.strides[1]) * elem,
                  row_bytes);
    }
  }
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_merged,
                  const TensorView& s_merged) {
  const int64_t n = v.shape[0], states = v.shape[1], heads = v.shape[2], head_dim = v.shape[3];
  std::vector<double> acc(static_cast<size_t>(head_dim));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      double max_lse = kNegInf;
      for (int64_t i = 0; i < states; ++i) {
        const double lse = load_as_double(s.data, DType::kFP32, r * s.strides[0] + i * s.strides[1] + h * s.strides[2]);
        if (lse > kNegInf) max_lse = std::max(max_lse, lse);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double merged_lse = kNegInf;
      if (max_lse > kNegInf) {
        double denom = 0.0;
        for (int64_t i = 0; i < states; ++i) {
          const double lse = load_as_double(s.data, DType::kFP32, r * s.strides[0] + i * s.strides[1] + h * s.strides[2]);
          if (!(lse > kNegInf)) continue;  // empty state: its v is meaningless
          const double w = std::exp(lse - max_lse);
          denom += w;
          const int64_t off = r * v.strides[0] + i * v.strides[1] + h * v.strides[2];
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * load_as_double(v.data, v.dtype, off + d);
        }
        for (int64_t d = 0; d < head_dim; ++d) acc[d] /= denom;
        merged_lse = max_lse + std::log(denom);
      }
      const int64_t out = r * v_merged.strides[0] + h * v_merged.strides[1];
      for (int64_t d = 0; d < head_dim; ++d) store_from_double(v_merged.data, v_merged.dtype, out + d, acc[d]);
      if (s_merged.defined()) {
        store_from_double(s_merged.data, DType::kFP32, r * s_merged.strides[0] + h * s_merged.strides[1],
                          merged_lse);
      }
    }
  }
}

}  // namespace gqattn::cpu
