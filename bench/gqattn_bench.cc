// gqattn-bench: times decode and prefill over the paged KV cache and reports achieved bandwidth
// (decode) or TFLOP/s (prefill), on the GPU against ceilings measured in the same run, or on the
// CPU backend at a small size when no GPU is present. Layer: bench (host-only CLI); the GPU
// timing lives in gpu_bench.cu. Columns follow ../shared/BENCHMARKS.md "Outputs".
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "api/cli_flags.h"
#include "api/host_float.h"
#include "api/validate.h"
#include "bench_case.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"

namespace gqattn::bench {
namespace {

constexpr int kGpuDefaultIters = 30;     // BENCHMARKS.md: median of >= 30 repetitions
constexpr int kCpuDefaultIters = 5;      // the CPU backend is a float64 oracle, not a contender
constexpr double kCpuMaxFlops = 2.5e8;   // cases above this are skipped on the CPU (~0.2 s each)
constexpr double kPoolSlack = 1.25;      // page pools hold this many times the pages needed
constexpr const char* kSweepHeader =
    "family,dtype,num_qo_heads,num_kv_heads,head_dim,page_size,batch,qo_len,kv_len,causal";
constexpr const char* kCsvHeader =
    "family,impl,dtype,num_qo_heads,num_kv_heads,head_dim,page_size,batch,qo_len,kv_len,causal,"
    "median_us,achieved,unit,pct_of_ceiling,status";

constexpr const char* kUsage = R"(gqattn-bench: time gqattn's decode and prefill attention.

Usage: gqattn-bench [flags]

With no case flags it runs the default job: Llama-2-7B attention shapes (32 query heads,
head_dim 128) with 32, 8 and 1 KV heads, decode and prefill; on the GPU at batch 8 x 2048
(decode) and 1 x 2048 causal (prefill), on the CPU at batch 2 x 256 and 1 x 128.

  --help                       this text
  --device auto|cpu|cuda       backend (auto: cuda when a GPU is usable, else cpu)
  --family decode|prefill|all  which family to run (default all)
  --sweep FILE                 cases from a CSV with the header
                               family,dtype,num_qo_heads,num_kv_heads,head_dim,page_size,
                               batch,qo_len,kv_len,causal   (page_size 0 = ragged K/V)
  --iters N                    timed repetitions, the median is reported (default 30 on the
                               GPU, 5 on the CPU)
  --csv PATH                   also write the results as CSV (BENCHMARKS.md columns)
  --max-splits N               cap on split-KV chunks per request (0: the planner's choice,
                               1: no split), for A/B runs of the split heuristic (default 0)
  --kv-chunk N                 split-KV in chunks of N keys (rounded up to the kernel's key
                               tile: PlanInputs::fixed_split_size), splits the planner would not
                               choose too; 0: the planner's choice (default); not with --max-splits
  --settle-ms N                GPU: the host sleeps N ms before each case's timed runs, so that
                               the card's power average (and its SM clock) recovers from the
                               rows before it, as between the peers' Python-timed rows (default 0)
  --layout nhd|hnd             the paged cases' page layout, in a sweep too (default nhd)
  --cuda-graph 0|1             GPU: plan each case as the engine's CUDA-graph decode steps do
                               (PlanInputs::enable_cuda_graph and graph_per_split: a fixed grid,
                               the kernel chosen from the batch alone) (default 0)

One case (any of these selects single-case mode; --family picks decode or prefill):
  --dtype bf16|fp16            (default bf16)
  --num-qo-heads N             (default 32)
  --num-kv-heads N             (default 8)
  --head-dim N                 (default 128)
  --page-size N                tokens per page, 0 = ragged K/V (prefill only) (default 16)
  --batch N                    requests (default 1)
  --qo-len N                   new tokens per request (default 1 for decode, kv-len for prefill)
  --kv-len N                   keys per request, new tokens included (default 1024)
  --causal 0|1                 (default 1; decode is always causal)

Flags also take the --flag=value form. Exit code 0 on success, 2 on a bad flag, 1 when the
single case is rejected, a case fails or --device cuda finds no GPU (a sweep row or default case
that this build or device cannot run, or too large for the CPU, is reported as skipped).
)";

using cli::parse_bool01;
using cli::parse_choice;
using cli::parse_int;
using cli::UsageError;

struct Options {
  std::string device = "auto";
  std::string family = "all";
  std::string sweep;
  std::string csv;
  int iters = 0;  // 0: the device's default
  int max_splits = 0;
  int kv_chunk = 0;
  int settle_ms = 0;
  bool cuda_graph = false;
  KVLayout layout = KVLayout::kNHD;  // every case's page layout (--layout)
  bool iters_given = false;
  bool help = false;
  bool single = false;
  bool qo_len_given = false;
  BenchCase single_case;
};

DType parse_dtype(const std::string& flag, const std::string& value) {
  if (value == "bf16") return DType::kBF16;
  if (value == "fp16") return DType::kFP16;
  throw UsageError{flag + ": expected bf16 or fp16, got '" + value + "'"};
}

// Lengths that the int32 index vectors can hold (batch x tokens summed over the batch).
void check_case_size(const BenchCase& c, const std::string& where) {
  if (int64_t(c.batch) * std::max(c.qo_len, c.kv_len) > INT32_MAX)
    throw UsageError{where + ": batch (" + std::to_string(c.batch) + ") x kv_len / qo_len exceeds int32 tokens"};
}

Options parse_args(int argc, char** argv) {
  Options opt;
  BenchCase& c = opt.single_case;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_value = false;
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--help" || flag == "-h") {
      opt.help = true;
      continue;
    }
    static const std::vector<std::string> kValueFlags = {
        "--device", "--family", "--sweep", "--csv", "--iters", "--max-splits", "--kv-chunk", "--settle-ms", "--cuda-graph",
        "--dtype", "--num-qo-heads", "--num-kv-heads", "--head-dim", "--page-size", "--batch", "--qo-len",
        "--kv-len", "--causal", "--layout"};
    if (std::find(kValueFlags.begin(), kValueFlags.end(), flag) == kValueFlags.end())
      throw UsageError{"unknown flag '" + flag + "'"};
    if (!has_value) {
      if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw UsageError{flag + ": missing value"};
      value = argv[++i];
    }
    if (flag == "--device") opt.device = parse_choice(flag, value, {"auto", "cpu", "cuda"});
    else if (flag == "--family") opt.family = parse_choice(flag, value, {"decode", "prefill", "all"});
    else if (flag == "--sweep") opt.sweep = value;
    else if (flag == "--csv") opt.csv = value;
    else if (flag == "--iters") { opt.iters = parse_int(flag, value); opt.iters_given = true; }
    else if (flag == "--max-splits") opt.max_splits = parse_int(flag, value);
    else if (flag == "--kv-chunk") opt.kv_chunk = parse_int(flag, value);
    else if (flag == "--settle-ms") opt.settle_ms = parse_int(flag, value);
    else if (flag == "--cuda-graph") opt.cuda_graph = parse_bool01(flag, value);
    else if (flag == "--layout") opt.layout = cli::parse_kv_layout(flag, value);
    else {
      opt.single = true;
      if (flag == "--dtype") c.dtype = parse_dtype(flag, value);
      else if (flag == "--num-qo-heads") c.num_qo_heads = parse_int(flag, value);
      else if (flag == "--num-kv-heads") c.num_kv_heads = parse_int(flag, value);
      else if (flag == "--head-dim") c.head_dim = parse_int(flag, value);
      else if (flag == "--page-size") c.page_size = parse_int(flag, value);
      else if (flag == "--batch") c.batch = parse_int(flag, value);
      else if (flag == "--qo-len") { c.qo_len = parse_int(flag, value); opt.qo_len_given = true; }
      else if (flag == "--kv-len") c.kv_len = parse_int(flag, value);
      else if (flag == "--causal") c.causal = parse_bool01(flag, value);
    }
  }
  if (opt.max_splits < 0) throw UsageError{"--max-splits: must be >= 0, got " + std::to_string(opt.max_splits)};
  if (opt.kv_chunk < 0) throw UsageError{"--kv-chunk: must be >= 0, got " + std::to_string(opt.kv_chunk)};
  if (opt.kv_chunk > 0 && opt.max_splits > 0) throw UsageError{"--kv-chunk: cannot be combined with --max-splits"};
  if (opt.settle_ms < 0) throw UsageError{"--settle-ms: must be >= 0, got " + std::to_string(opt.settle_ms)};
  if (opt.iters_given && opt.iters < 1)
    throw UsageError{"--iters: must be >= 1, got " + std::to_string(opt.iters)};
  if (opt.single && !opt.sweep.empty())
    throw UsageError{"--sweep: cannot be combined with single-case flags (--dtype, --batch, ...)"};
  if (opt.single) {
    c.family = opt.family == "prefill" ? "prefill" : "decode";
    if (c.family == "decode") c.causal = true;  // decode is always causal (--help)
    if (c.family == "prefill" && !opt.qo_len_given) c.qo_len = c.kv_len;
    if (c.batch < 0) throw UsageError{"--batch: must be >= 0, got " + std::to_string(c.batch)};
    if (c.kv_len < 0) throw UsageError{"--kv-len: must be >= 0, got " + std::to_string(c.kv_len)};
    if (c.qo_len < 1) throw UsageError{"--qo-len: must be >= 1, got " + std::to_string(c.qo_len)};
    check_case_size(c, "--batch");
  }
  return opt;
}

// ---- cases ------------------------------------------------------------------------------------

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream is(line);
  while (std::getline(is, field, ',')) {
    while (!field.empty() && (field.back() == '\r' || field.back() == ' ')) field.pop_back();
    while (!field.empty() && field.front() == ' ') field.erase(field.begin());
    out.push_back(field);
  }
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

std::vector<BenchCase> read_sweep(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError{"--sweep: cannot open '" + path + "'"};
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line != kSweepHeader)
    throw UsageError{"--sweep: " + path + ": expected the header '" + kSweepHeader + "', got '" + line + "'"};
  std::vector<BenchCase> cases;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \r") == std::string::npos) continue;
    const std::vector<std::string> f = split_csv_line(line);
    const std::string where = "--sweep: " + path + ":" + std::to_string(line_no);
    if (f.size() != 10) throw UsageError{where + ": expected 10 fields, got " + std::to_string(f.size())};
    BenchCase c;
    c.family = parse_choice(where + ": family", f[0], {"decode", "prefill"});
    c.dtype = parse_dtype(where + ": dtype", f[1]);
    c.num_qo_heads = parse_int(where + ": num_qo_heads", f[2]);
    c.num_kv_heads = parse_int(where + ": num_kv_heads", f[3]);
    c.head_dim = parse_int(where + ": head_dim", f[4]);
    c.page_size = parse_int(where + ": page_size", f[5]);
    c.batch = parse_int(where + ": batch", f[6]);
    c.qo_len = parse_int(where + ": qo_len", f[7]);
    c.kv_len = parse_int(where + ": kv_len", f[8]);
    c.causal = parse_bool01(where + ": causal", f[9]) || c.family == "decode";  // decode: always causal
    if (c.batch < 0 || c.kv_len < 0 || c.qo_len < 1)
      throw UsageError{where + ": batch and kv_len must be >= 0 and qo_len >= 1"};
    check_case_size(c, where);
    cases.push_back(c);
  }
  return cases;
}

// Llama-2-7B attention (32 query heads, head_dim 128) as MHA, GQA-8 and MQA.
std::vector<BenchCase> default_cases(bool gpu) {
  std::vector<BenchCase> cases;
  for (const char* family : {"decode", "prefill"}) {
    for (const int kv_heads : {32, 8, 1}) {
      BenchCase c;
      c.family = family;
      c.dtype = DType::kBF16;
      c.num_qo_heads = 32;
      c.num_kv_heads = kv_heads;
      c.head_dim = 128;
      c.causal = true;
      if (c.family == "decode") {
        c.page_size = 16;
        c.batch = gpu ? 8 : 2;
        c.qo_len = 1;
        c.kv_len = gpu ? 2048 : 256;
      } else {
        c.page_size = 0;
        c.batch = 1;
        c.kv_len = gpu ? 2048 : 128;
        c.qo_len = c.kv_len;
      }
      cases.push_back(c);
    }
  }
  return cases;
}

bool is_decode(const BenchCase& c) { return c.family == "decode"; }

// Multiply-adds x 2 of a case, decode or prefill (what the CPU backend's time scales with).
double case_flops(const BenchCase& c) {
  if (!is_decode(c)) return prefill_flops(c);
  return 4.0 * c.batch * double(c.qo_len) * c.kv_len * c.num_qo_heads * c.head_dim;
}

// The plan inputs of a case: `batch` requests of kv_len keys and qo_len new tokens.
PlanInputs plan_inputs_for(const BenchCase& c, Device device) {
  PlanInputs in;
  in.device = device;
  in.dtype = c.dtype;
  in.num_qo_heads = c.num_qo_heads;
  in.num_kv_heads = c.num_kv_heads;
  in.head_dim = c.head_dim;
  in.page_size = c.page_size;
  in.causal = c.causal;
  in.qo_len = c.qo_len;
  in.max_num_splits = c.max_num_splits;
  in.fixed_split_size = c.fixed_split_size;
  in.kv_indptr.push_back(0);
  if (!is_decode(c)) in.qo_indptr.push_back(0);
  for (int b = 0; b < c.batch; ++b) {
    if (c.page_size > 0) {
      const int pages = (c.kv_len + c.page_size - 1) / c.page_size;
      in.kv_indptr.push_back(in.kv_indptr.back() + pages);
      in.kv_last_page_len.push_back(pages == 0 ? 0 : c.kv_len - (pages - 1) * c.page_size);
    } else {
      in.kv_indptr.push_back(in.kv_indptr.back() + c.kv_len);
    }
    if (!is_decode(c)) in.qo_indptr.push_back(in.qo_indptr.back() + c.qo_len);
  }
  return in;
}

// ---- CPU timing -------------------------------------------------------------------------------

// Owned host memory with a view over it; random values in [-1, 1] (never zero).
struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;
};

Buffer random_buffer(std::initializer_list<int64_t> shape, DType dtype, std::mt19937& rng) {
  Buffer buf;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  buf.bytes.resize(size_t(n) * dtype_size(dtype));
  std::uniform_real_distribution<float> mag(0.05f, 1.f);
  for (int64_t i = 0; i < n; ++i) store_from_double(buf.bytes.data(), dtype, i, (rng() & 1) ? mag(rng) : -mag(rng));
  buf.view = TensorView::contiguous(buf.bytes.data(), shape, dtype);
  return buf;
}

Buffer int_buffer(const std::vector<int32_t>& values) {
  Buffer buf;
  buf.bytes.resize(values.size() * sizeof(int32_t));
  if (!values.empty()) std::memcpy(buf.bytes.data(), values.data(), buf.bytes.size());
  buf.view = TensorView::contiguous(buf.bytes.data(), {int64_t(values.size())}, DType::kInt32);
  return buf;
}

BenchResult cpu_run_case(const BenchCase& c, int iters) {
  const PlanInputs in = plan_inputs_for(c, Device::kCPU);
  std::mt19937 rng(1234);
  const int64_t total_qo = int64_t(c.batch) * c.qo_len;
  Buffer q = random_buffer({total_qo, c.num_qo_heads, c.head_dim}, c.dtype, rng);
  Buffer o = random_buffer({total_qo, c.num_qo_heads, c.head_dim}, c.dtype, rng);
  Buffer lse = random_buffer({total_qo, c.num_qo_heads}, DType::kFP32, rng);
  Buffer k, v, indptr, indices, last, qo_indptr;
  PagedKV paged;
  RaggedKV ragged;
  if (c.page_size > 0) {
    // A random permutation of a pool larger than needed: pages are neither contiguous nor in order.
    const int64_t needed = in.kv_indptr.back();
    const int64_t pool = int64_t(needed * kPoolSlack) + 1;
    std::vector<int32_t> ids(static_cast<size_t>(pool));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(size_t(needed));
    const bool hnd = c.layout == KVLayout::kHND;
    const int64_t d1 = hnd ? c.num_kv_heads : c.page_size, d2 = hnd ? c.page_size : c.num_kv_heads;
    k = random_buffer({pool, d1, d2, c.head_dim}, c.dtype, rng);
    v = random_buffer({pool, d1, d2, c.head_dim}, c.dtype, rng);
    indptr = int_buffer(in.kv_indptr);
    indices = int_buffer(ids);
    last = int_buffer(in.kv_last_page_len);
    paged.k_pages = k.view;
    paged.v_pages = v.view;
    paged.layout = c.layout;
    paged.kv_page_indptr = indptr.view;
    paged.kv_page_indices = indices.view;
    paged.kv_last_page_len = last.view;
  } else {
    const int64_t total_kv = in.kv_indptr.back();
    k = random_buffer({total_kv, c.num_kv_heads, c.head_dim}, c.dtype, rng);
    v = random_buffer({total_kv, c.num_kv_heads, c.head_dim}, c.dtype, rng);
    indptr = int_buffer(in.kv_indptr);
    ragged.k = k.view;
    ragged.v = v.view;
    ragged.kv_indptr = indptr.view;
  }

  std::vector<double> times_us;
  if (is_decode(c)) {
    const Plan plan = decode_plan(in, Workspace{});
    DecodeArgs args;
    args.q = q.view;
    args.kv = paged;
    args.o = o.view;
    args.lse = lse.view;
    decode_run(plan, args);  // warm-up
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      decode_run(plan, args);
      times_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  } else {
    const Plan plan = prefill_plan(in, Workspace{});
    qo_indptr = int_buffer(in.qo_indptr);
    PrefillArgs args;
    args.q = q.view;
    args.qo_indptr = qo_indptr.view;
    args.paged = paged;
    args.ragged = ragged;
    args.causal = in.causal;
    args.o = o.view;
    args.lse = lse.view;
    prefill_run(plan, args);  // warm-up
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      prefill_run(plan, args);
      times_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  BenchResult r;
  r.median_us = median_of(times_us);
  const double seconds = r.median_us * 1e-6;
  if (is_decode(c)) {
    r.achieved = decode_bytes(c) / seconds / 1e9;
    r.unit = "GB/s";
  } else {
    r.achieved = prefill_flops(c) / seconds / 1e12;
    r.unit = "TFLOP/s";
  }
  r.pct_of_ceiling = 0;
  r.status = "ok (cpu)";
  return r;
}

// ---- output -----------------------------------------------------------------------------------

struct Row {
  std::string family, impl, dtype;
  std::string num_qo_heads, num_kv_heads, head_dim, page_size, batch, qo_len, kv_len, causal;
  std::string median_us, achieved, unit, pct_of_ceiling, status;
  std::string plan;  // printed after the status, not written to the CSV
};

std::string fmt(double value, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

Row case_row(const BenchCase& c, const BenchResult& r, bool ran, bool cpu) {
  Row row{c.family, "gqattn", dtype_name(c.dtype),
          std::to_string(c.num_qo_heads), std::to_string(c.num_kv_heads), std::to_string(c.head_dim),
          std::to_string(c.page_size), std::to_string(c.batch), std::to_string(c.qo_len),
          std::to_string(c.kv_len), c.causal ? "1" : "0",
          "", "", is_decode(c) ? "GB/s" : "TFLOP/s", "", r.status, ""};
  if (ran) {
    row.median_us = fmt(r.median_us, "%.3f");
    row.achieved = fmt(r.achieved, "%.6g");
    row.unit = r.unit;
    if (!cpu) row.pct_of_ceiling = fmt(r.pct_of_ceiling, "%.1f");
    row.plan = r.plan;
  }
  return row;
}

std::vector<std::string> fields(const Row& r) {
  return {r.family, r.impl, r.dtype, r.num_qo_heads, r.num_kv_heads, r.head_dim, r.page_size,
          r.batch, r.qo_len, r.kv_len, r.causal, r.median_us, r.achieved, r.unit,
          r.pct_of_ceiling, r.status};
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream out(path);
  if (!out) throw Error("--csv: cannot write '" + path + "'");
  out << kCsvHeader << '\n';
  for (const Row& r : rows) {
    const auto f = fields(r);
    for (size_t i = 0; i < f.size(); ++i) out << (i ? "," : "") << csv_field(f[i]);
    out << '\n';
  }
  if (!out) throw Error("--csv: failed writing '" + path + "'");
}

void print_table_header() {
  std::printf("%-8s %-7s %-5s %4s %4s %4s %5s %6s %6s %7s %3s %12s %12s %-8s %6s  %s\n", "family",
              "impl", "dtype", "hq", "hkv", "dim", "page", "batch", "qo", "kv", "cau", "median_us",
              "achieved", "unit", "%ceil", "status");
}

void print_row(const Row& r) {
  std::printf("%-8s %-7s %-5s %4s %4s %4s %5s %6s %6s %7s %3s %12s %12s %-8s %6s  %s%s%s\n",
              r.family.c_str(), r.impl.c_str(), r.dtype.c_str(), r.num_qo_heads.c_str(),
              r.num_kv_heads.c_str(), r.head_dim.c_str(), r.page_size.c_str(), r.batch.c_str(),
              r.qo_len.c_str(), r.kv_len.c_str(), r.causal.c_str(), r.median_us.c_str(),
              r.achieved.c_str(), r.unit.c_str(), r.pct_of_ceiling.c_str(), r.status.c_str(),
              r.plan.empty() ? "" : "  plan: ", r.plan.c_str());
  std::fflush(stdout);
}

// ---- main -------------------------------------------------------------------------------------

int run(const Options& opt) {
  const int gpus = cuda_device_count();
  bool gpu = false;
  if (opt.device == "cuda") {
    if (gpus == 0) {
      std::fprintf(stderr, "gqattn-bench: --device cuda: no usable CUDA device (%s)\n",
                   build_info().cuda ? "none found" : "this build has no CUDA backend; configure with -DGQATTN_CUDA=ON");
      return 1;
    }
    gpu = true;
  } else if (opt.device == "auto") {
    gpu = gpus > 0;
  }
  const Device device = gpu ? Device::kCUDA : Device::kCPU;
  const int iters = opt.iters > 0 ? opt.iters : (gpu ? kGpuDefaultIters : kCpuDefaultIters);

  std::vector<BenchCase> cases;
  if (opt.single) {
    cases.push_back(opt.single_case);
  } else {
    cases = opt.sweep.empty() ? default_cases(gpu) : read_sweep(opt.sweep);
    if (opt.family != "all") {
      cases.erase(std::remove_if(cases.begin(), cases.end(),
                                 [&](const BenchCase& c) { return c.family != opt.family; }),
                  cases.end());
    }
  }
  for (BenchCase& c : cases) {
    c.max_num_splits = opt.max_splits;
    c.fixed_split_size = opt.kv_chunk;
    c.settle_ms = opt.settle_ms;
    c.cuda_graph = opt.cuda_graph;
    c.layout = opt.layout;
  }

  // One set of rules: a single case the library would reject is an error (exit 1).
  if (opt.single) {
    try {
      validate_plan_inputs(plan_inputs_for(cases[0], device), is_decode(cases[0]));
    } catch (const Error& e) {
      std::fprintf(stderr, "gqattn-bench: rejected: %s\n", e.what());
      return 1;
    }
  }

  if (gpu) {
    std::printf("gqattn-bench: backend cuda (%d device%s visible; timing on device 0), %d iters\n",
                gpus, gpus == 1 ? "" : "s", iters);
  } else {
    // Why the CPU runs, and (for the default job only) that it runs at a small size.
    const char* why = opt.device == "cpu"        ? "cpu chosen with --device cpu"
                      : !build_info().cuda       ? "this build has no CUDA backend (-DGQATTN_CUDA=OFF or no nvcc found)"
                                                 : "no CUDA device is visible";
    const bool default_job = !opt.single && opt.sweep.empty();
    std::printf("gqattn-bench: backend cpu (float64 reference), %d iters; %s%s\n", iters, why,
                default_job ? ", so the default job runs a small size" : "");
  }

  std::vector<Row> rows;
#ifdef GQATTN_WITH_CUDA
  Ceilings ceilings;
  if (gpu) {
    ceilings = gpu_measure_ceilings();
    std::printf("ceilings: read %.0f GB/s, copy %.0f GB/s, bf16 GEMM %.1f TFLOP/s\n",
                ceilings.read_gbps, ceilings.copy_gbps, ceilings.gemm_tflops);
    const struct { const char* impl; const char* dtype; double value; const char* unit; } kCeil[] = {
        {"read", "", ceilings.read_gbps, "GB/s"},
        {"copy", "", ceilings.copy_gbps, "GB/s"},
        {"gemm", "bf16", ceilings.gemm_tflops, "TFLOP/s"}};
    for (const auto& ce : kCeil) {
      Row row{};
      row.family = "ceiling";
      row.impl = ce.impl;
      row.dtype = ce.dtype;
      row.achieved = fmt(ce.value, "%.6g");
      row.unit = ce.unit;
      row.pct_of_ceiling = "100.0";
      row.status = "ok";
      rows.push_back(row);
    }
  }
#endif

  print_table_header();
  for (const Row& r : rows) print_row(r);
  int failures = 0;
  for (const BenchCase& c : cases) {
    BenchResult r;
    bool ran = false;
    try {
      validate_plan_inputs(plan_inputs_for(c, device), is_decode(c));
    } catch (const Error& e) {
      // A sweep row this build or device cannot run (e.g. a head_dim not compiled) is reported.
      r.status = std::string("skipped: ") + e.what();
      rows.push_back(case_row(c, r, false, !gpu));
      print_row(rows.back());
      continue;
    }
    try {
      if (!gpu && case_flops(c) > kCpuMaxFlops) {
        r.status = "skipped: too large for the cpu backend";
      } else {
#ifdef GQATTN_WITH_CUDA
        r = gpu ? gpu_run_case(c, ceilings, iters) : cpu_run_case(c, iters);
#else
        r = cpu_run_case(c, iters);
#endif
        ran = r.status.rfind("ok", 0) == 0;
      }
    } catch (const std::exception& e) {
      r.status = std::string("error: ") + e.what();
      ++failures;
    }
    rows.push_back(case_row(c, r, ran, !gpu));
    print_row(rows.back());
  }
  if (!opt.csv.empty()) {
    write_csv(opt.csv, rows);
    std::printf("wrote %zu rows to %s\n", rows.size(), opt.csv.c_str());
  }
  if (failures > 0) {
    std::fprintf(stderr, "gqattn-bench: %d case%s failed\n", failures, failures == 1 ? "" : "s");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace gqattn::bench

int main(int argc, char** argv) {
  using namespace gqattn::bench;
  Options opt;
  try {
    opt = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gqattn-bench: %s\nRun gqattn-bench --help for the flags.\n", e.message.c_str());
    return 2;
  }
  if (opt.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return run(opt);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gqattn-bench: %s\n", e.message.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gqattn-bench: %s\n", e.what());
    return 1;
  }
}
