// The library called from several user threads at once: CPU plans and runs of decode and prefill
// (each large enough for the CPU backend to spread its rows over its own threads), append_kv,
// merge_states, the page-table conversions, a rejected call and build_info, every thread on its
// own outputs over shared read-only inputs, each result bitwise equal to the same call made alone.
// And a call whose helper threads cannot be started (a process at its thread limit, as many
// concurrent callers can bring about) still computes its result on the calling thread.
// Layer: tests/cpu (label cpu). Built with GQATTN_SANITIZE=thread it is the races' probe.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu/attention_problem.h"

namespace gqattn::test {
namespace {

using Bytes = std::vector<uint8_t>;

void append_bytes(Bytes& out, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + n);
}
void append_bytes(Bytes& out, const HostTensor& t) { append_bytes(out, t.data(), t.bytes()); }
void append_ints(Bytes& out, const std::vector<int32_t>& v) {
  const int32_t n = int32_t(v.size());
  append_bytes(out, &n, sizeof(n));
  append_bytes(out, v.data(), v.size() * sizeof(int32_t));
}

// One call of the library with inputs made once (shared, read-only, by every thread that runs it)
// and outputs made afresh on each run; run() returns every byte it wrote.
struct Job {
  std::string name;
  std::function<Bytes()> run;
};

// Decode over paged K/V: 16 requests of 2 new tokens, G = 4, ~9M multiply-adds (over the CPU
// backend's bar for spreading a call over its threads).
Job decode_job(KVLayout layout, DType dtype, uint64_t seed) {
  Problem p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.dtype = dtype;
  for (int b = 0; b < 16; ++b) {
    p.qo_len.push_back(2);
    p.kv_len.push_back(400 + (b * 37) % 300);
  }
  p.seed = seed;
  auto in = std::make_shared<Inputs>(make_inputs(p));
  auto paged = std::make_shared<PagedKVHost>(make_paged_kv(in->k, in->v, p.kv_len, 16, layout, seed + 1));
  return {std::string("decode ") + layout_name(layout) + " " + dtype_name(dtype), [p, in, paged] {
            PlanInputs pi = plan_inputs(p, 16, paged->table.kv_page_indptr, paged->table.kv_last_page_len);
            pi.qo_len = 2;
            const Plan plan = decode_plan(pi, Workspace{});
            Output out = make_output(p, in->qo_indptr.back());
            DecodeArgs args;
            args.q = in->q.view();
            args.kv = paged->view();
            args.o = out.o.view();
            args.lse = out.lse.view();
            decode_run(plan, args);
            Bytes bytes;
            append_bytes(bytes, out.o);
            append_bytes(bytes, out.lse);
            return bytes;
          }};
}

// Prefill (causal, chunked: a cached prefix) over ragged K/V (page_size 0) or pages: 4 requests,
// G = 4, ~10M multiply-adds.
Job prefill_job(int page_size, KVLayout layout, DType dtype, bool causal, uint64_t seed) {
  Problem p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.dtype = dtype;
  p.causal = causal;
  p.qo_len = {70, 0, 96, 41};
  p.kv_len = {120, 33, 96, 200};
  p.seed = seed;
  auto in = std::make_shared<Inputs>(make_inputs(p));
  return {"prefill page " + std::to_string(page_size) + " " + layout_name(layout) + " " + dtype_name(dtype),
          [p, in, page_size, layout] {
            const Output out = run_prefill(p, *in, page_size, layout);
            Bytes bytes;
            append_bytes(bytes, out.o);
            append_bytes(bytes, out.lse);
            return bytes;
          }};
}

// append_kv of 40 tokens (shuffled requests and positions) into a fresh copy of a shared pool.
Job append_job(KVLayout layout, uint64_t seed) {
  const std::vector<int32_t> kv_len = {13, 0, 27};
  auto pools = std::make_shared<PagedKVHost>(
      make_paged_kv(random_tensor({40, 2, 64}, DType::kBF16, seed), random_tensor({40, 2, 64}, DType::kBF16, seed + 1),
                    kv_len, 4, layout, seed + 2));
  std::vector<int32_t> batch, pos;
  for (int t = 0; t < 40; ++t) {
    const int row = (t * 17) % 40;  // a permutation of the 40 slots
    batch.push_back(row < 13 ? 0 : 2);
    pos.push_back(row < 13 ? row : row - 13);
  }
  auto k_new = std::make_shared<HostTensor>(random_tensor({40, 2, 64}, DType::kBF16, seed + 3));
  auto v_new = std::make_shared<HostTensor>(random_tensor({40, 2, 64}, DType::kBF16, seed + 4));
  auto bt = std::make_shared<HostTensor>(HostTensor::from_int32(batch));
  auto ps = std::make_shared<HostTensor>(HostTensor::from_int32(pos));
  return {std::string("append_kv ") + layout_name(layout), [pools, k_new, v_new, bt, ps] {
            PagedKVHost mine = *pools;
            append_kv(mine.view(), k_new->view(), v_new->view(), bt->view(), ps->view());
            Bytes bytes;
            append_bytes(bytes, mine.k_pages);
            append_bytes(bytes, mine.v_pages);
            return bytes;
          }};
}

// merge_states of 3 partial states (one of them empty in some rows) into bf16 with the LSE.
Job merge_job(uint64_t seed) {
  auto v = std::make_shared<HostTensor>(random_tensor({37, 3, 4, 64}, DType::kFP32, seed));
  auto s = std::make_shared<HostTensor>(random_tensor({37, 3, 4}, DType::kFP32, seed + 1));
  for (int64_t r = 0; r < 37; r += 5) s->set({r, 1, 2}, -INFINITY);
  return {"merge_states", [v, s] {
            HostTensor v_merged({37, 4, 64}, DType::kBF16), s_merged({37, 4}, DType::kFP32);
            merge_states(v->view(), s->view(), v_merged.view(), s_merged.view());
            Bytes bytes;
            append_bytes(bytes, v_merged);
            append_bytes(bytes, s_merged);
            return bytes;
          }};
}

// The page-table conversions both ways and kv_lengths.
Job page_table_job(uint64_t seed) {
  auto table = std::make_shared<PageTable>(make_random_page_table({0, 1, 16, 17, 47, 3, 100}, 3, seed));
  return {"page tables", [table] {
            const PageTableCSR csr{table->kv_page_indptr, table->kv_page_indices, table->kv_last_page_len};
            const BlockTable block = csr_to_block_table(csr, 3);
            const PageTableCSR back = block_table_to_csr(block, 3);
            Bytes bytes;
            append_ints(bytes, block.pages);
            append_ints(bytes, block.kv_len);
            append_ints(bytes, back.kv_page_indptr);
            append_ints(bytes, back.kv_page_indices);
            append_ints(bytes, back.kv_last_page_len);
            append_ints(bytes, kv_lengths(csr.kv_page_indptr, csr.kv_last_page_len, 3));
            return bytes;
          }};
}

// A rejected run (o of the wrong shape) and a rejected plan: their messages; build_info and
// cuda_device_count.
Job errors_and_info_job() {
  Problem p;
  p.qo_len = {1, 1};
  p.kv_len = {5, 9};
  auto in = std::make_shared<Inputs>(make_inputs(p));
  auto paged = std::make_shared<PagedKVHost>(make_paged_kv(in->k, in->v, p.kv_len, 4, KVLayout::kNHD, 3));
  return {"errors and build_info", [p, in, paged] {
            Bytes bytes;
            const PlanInputs pi = plan_inputs(p, 4, paged->table.kv_page_indptr, paged->table.kv_last_page_len);
            const Plan plan = decode_plan(pi, Workspace{});
            HostTensor o({3, p.num_qo_heads, p.head_dim}, p.dtype);
            DecodeArgs args;
            args.q = in->q.view();
            args.kv = paged->view();
            args.o = o.view();
            std::string message = "no error";
            try {
              decode_run(plan, args);
            } catch (const Error& e) {
              message = e.what();
            }
            append_bytes(bytes, message.data(), message.size());
            PlanInputs bad = pi;
            bad.num_kv_heads = 3;
            message = "no error";
            try {
              decode_plan(bad, Workspace{});
            } catch (const Error& e) {
              message = e.what();
            }
            append_bytes(bytes, message.data(), message.size());
            const BuildInfo info = build_info();
            append_bytes(bytes, &info.cuda, sizeof(info.cuda));
            append_ints(bytes, std::vector<int32_t>(info.head_dims.begin(), info.head_dims.end()));
            append_ints(bytes, std::vector<int32_t>(info.cuda_archs.begin(), info.cuda_archs.end()));
            const int devices = cuda_device_count();
            append_bytes(bytes, &devices, sizeof(devices));
            return bytes;
          }};
}

std::vector<Job> make_jobs() {
  return {decode_job(KVLayout::kNHD, DType::kBF16, 11),
          decode_job(KVLayout::kHND, DType::kFP32, 12),
          prefill_job(0, KVLayout::kNHD, DType::kFP32, /*causal=*/true, 13),
          prefill_job(16, KVLayout::kHND, DType::kFP16, /*causal=*/false, 14),
          append_job(KVLayout::kNHD, 15),
          append_job(KVLayout::kHND, 16),
          merge_job(17),
          page_table_job(18),
          errors_and_info_job()};
}

// Four user threads, released together, each running every job twice in its own order (thread t
// starts at job 2t, so the large calls overlap one another): each result equals the job's result
// computed alone before the threads started.
TEST(ConcurrentCalls, EveryThreadGetsTheSingleThreadedBits) {
  const std::vector<Job> jobs = make_jobs();
  std::vector<Bytes> alone;
  for (const Job& job : jobs) alone.push_back(job.run());
  ASSERT_NE(alone.back().size(), 0u);

  constexpr int kThreads = 4, kRounds = 2;
  // results[t][i]: thread t's runs of job i, in order.
  std::vector<std::vector<std::vector<Bytes>>> results(kThreads, std::vector<std::vector<Bytes>>(jobs.size()));
  std::vector<std::string> failures(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      try {
        for (int round = 0; round < kRounds; ++round)
          for (size_t k = 0; k < jobs.size(); ++k) {
            const size_t i = (2 * t + k) % jobs.size();
            results[t][i].push_back(jobs[i].run());
          }
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(results[t][i].size(), size_t(kRounds)) << "thread " << t << ", " << jobs[i].name;
      for (const Bytes& got : results[t][i]) EXPECT_TRUE(got == alone[i]) << "thread " << t << ", " << jobs[i].name;
    }
  }
}

// Makes every thread started from now on ask for a stack larger than the address space, so that
// std::thread's constructor throws std::system_error (EAGAIN), as at a process's thread limit;
// restores the default it replaced on destruction (nothing where it could not read or set one).
class NoNewThreads {
 public:
  NoNewThreads() {
    saved_ = pthread_getattr_default_np(&old_) == 0;
    pthread_attr_t huge;
    if (!saved_ || pthread_attr_init(&huge) != 0) return;
    set_ = pthread_attr_setstacksize(&huge, size_t(1) << 50) == 0 && pthread_setattr_default_np(&huge) == 0;
    pthread_attr_destroy(&huge);  // the default holds a copy
  }
  ~NoNewThreads() {
    if (set_) pthread_setattr_default_np(&old_);
    if (saved_) pthread_attr_destroy(&old_);
  }
  NoNewThreads(const NoNewThreads&) = delete;
  NoNewThreads& operator=(const NoNewThreads&) = delete;
  // Whether a thread now fails to start (false where the fault cannot be made here).
  bool active() const {
    if (!set_) return false;
    try {
      std::thread([] {}).join();
      return false;
    } catch (const std::system_error&) {
      return true;
    }
  }

 private:
  pthread_attr_t old_;
  bool saved_ = false, set_ = false;  // old_ holds the default; the huge stack is the default now
};

// The CPU backend starts helper threads for a large call; where none can be started (many
// concurrent callers at a thread limit) the call runs on the calling thread, with the same bits,
// rather than throwing std::system_error or, once some helpers are running, ending the process.
TEST(ConcurrentCalls, LargeCallWhoseHelperThreadsCannotStart) {
  const std::vector<Job> jobs = {prefill_job(0, KVLayout::kNHD, DType::kFP32, /*causal=*/true, 13),
                                 decode_job(KVLayout::kNHD, DType::kBF16, 11)};
  std::vector<Bytes> alone;
  for (const Job& job : jobs) alone.push_back(job.run());
  std::vector<Bytes> got;
  std::string failure;
  {
    const NoNewThreads fault;
    if (!fault.active()) GTEST_SKIP() << "threads still start with a stack larger than the address space";
    try {
      for (const Job& job : jobs) got.push_back(job.run());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  ASSERT_EQ(failure, "");
  ASSERT_EQ(got.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_TRUE(got[i] == alone[i]) << jobs[i].name;
}

}  // namespace
}  // namespace gqattn::test
