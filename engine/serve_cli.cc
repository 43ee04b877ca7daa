// gqattn-serve: the serving engine's CLI. `bench` runs the end-to-end latency table of
// ../shared/BENCHMARKS.md ("End to end": N requests x (prompt + generated tokens), all admitted at
// once when the page pool allows) and reports time against the memory-traffic floor; `generate`
// prints the tokens one prompt produces. Layer: engine (host-only CLI).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "api/cli_flags.h"
#include "api/env_flag.h"
#include "config.h"
#include "engine.h"
#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "hf_config.h"
#include "random.h"

namespace gqattn::engine {
namespace {

constexpr const char* kCsvHeader =
    "model,num_kv_heads,attention,requests,prompt_len,output_len,kv_pool_gib,seconds,output_tokens_per_s,"
    "mean_step_ms,floor_s,ratio_to_floor,status";
// The CPU path runs plain loops: larger models would take hours.
constexpr int64_t kCpuMaxParams = int64_t(1) << 30;
// Without flags, the CPU bench runs this (the GPU one runs the BENCHMARKS.md table's shape).
constexpr int kCpuRequests = 4, kCpuPromptLen = 8, kCpuOutputLen = 16;
constexpr int kDefaultBatchedTokens = 8192;
constexpr double kProgressSeconds = 0.25;
constexpr double kGiB = double(int64_t(1) << 30);

constexpr const char* kUsage = R"(gqattn-serve: a Llama-architecture serving engine on gqattn's paged KV cache.

Usage:
  gqattn-serve bench [flags]      the end-to-end latency table: requests x (prompt + output)
  gqattn-serve generate [flags]   one prompt's generated token ids
  gqattn-serve --help

bench flags:
  --model llama2-7b|llama3-8b|llama3.1-8b|tiny   (default: the --weights config.json's model, else
                             llama2-7b on a GPU, tiny on the CPU)
  --requests N               (default 128; 4 on the CPU)
  --prompt-len N             prompt tokens per request (default 32; 8 on the CPU)
  --output-len N             generated tokens per request (default 992; 16 on the CPU)
  --kv-pool-gib X            K/V pool size (default: room for every request at full length,
                             within free device memory)
  --bandwidth-gbps X         read bandwidth for the floor (default: measured by a streaming read)
  --csv PATH                 append the result row (BENCHMARKS.md e2e columns) to PATH
  --max-num-seqs N           running requests at most (default: --requests)
  --max-num-batched-tokens N tokens per step (default max(8192, max-num-seqs))
generate flags:
  --model NAME               (default: the --weights config.json's model, else tiny)
  --prompt 1,2,3             prompt token ids (required)
  --max-new-tokens N         (default 16)
  --temperature X --top-k N --top-p X   sampling (default greedy; top-k <= 0 and top-p 1 are off)
common flags:
  --device auto|cpu|cuda     (auto: cuda when a GPU is usable)
  --num-kv-heads N           override the model's K/V heads (32, 8, 1: must divide its query heads)
  --attention gqattn|expand  attention backend (default gqattn)
  --seed N                   weights, prompts and sampling (default 0)
  --weights PATH             a safetensors file or directory in the Hugging Face Llama layout;
                             a config.json there gives the model when --model is not given
                             (then without --num-kv-heads), else must match --model and
                             --num-kv-heads (default: random bf16 weights)
  --page-size N              tokens per K/V page (default 16)
  --kv-layout nhd|hnd        K/V pages as [page, token, head, dim] (nhd, vLLM's) or [page, head,
                             token, dim] (hnd: a page's keys of one head contiguous) (default nhd)
  --cuda-graph 0|1           capture decode steps in CUDA graphs (default 1)
  --prefix-caching 0|1       share cached pages of identical prompt prefixes (default 0)

Flags also take the --flag=value form. Exit code 0 on success, 2 on a bad flag, 1 when the
configuration is impossible or the run fails.
)";

using cli::parse_bool01;
using cli::parse_choice;
using cli::parse_double;
using cli::parse_int;
using cli::parse_int64;
using cli::UsageError;

// A path flag's value: empty (--weights=$UNSET) is an error, not "no path".
std::string parse_path(const std::string& flag, const std::string& value) {
  if (value.empty()) throw UsageError{flag + ": empty path"};
  return value;
}

// GQATTN_PROFILE_STEPS=FIRST[:COUNT] (default COUNT 2): the bench's steps FIRST .. FIRST + COUNT - 1
// (from 0, every step counted) run inside the profiler's window, for `ncu --profile-from-start off`
// (scripts/profile_engine.sh). With the step overlap a step's call also queues the next step, so
// the window holds about COUNT steps' launches. Unset: first = -1, no window.
struct ProfileWindow {
  int64_t first = -1, count = 0;
};
ProfileWindow parse_profile_window() {
  const char* env = std::getenv("GQATTN_PROFILE_STEPS");
  ProfileWindow w;
  if (env == nullptr || *env == '\0') return w;
  const std::string v = env;
  const size_t colon = v.find(':');
  w.first = parse_int64("GQATTN_PROFILE_STEPS", v.substr(0, colon), 0, INT32_MAX);
  w.count = colon == std::string::npos ? 2 : parse_int64("GQATTN_PROFILE_STEPS", v.substr(colon + 1), 1, INT32_MAX);
  return w;
}

struct Options {
  std::string command;
  std::string model;
  int num_kv_heads = 0;
  int requests = 128, prompt_len = 32, output_len = 992;
  // Which of the three were given: on the CPU the others take the CPU defaults (--help).
  bool requests_given = false, prompt_len_given = false, output_len_given = false;
  double kv_pool_gib = 0;
  std::string attention = "gqattn";
  std::string device = "auto";
  std::string csv;
  uint64_t seed = 0;
  std::string weights;
  int page_size = 16;
  KVLayout kv_layout = KVLayout::kNHD;
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  double bandwidth_gbps = 0;
  bool cuda_graph = true;
  bool prefix_caching = false;
  ProfileWindow profile;  // GQATTN_PROFILE_STEPS (bench)
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
};

// A finite number > 0.
double parse_positive(const std::string& flag, const std::string& value) {
  const double v = parse_double(flag, value, -INFINITY);
  if (v <= 0) throw UsageError{flag + ": must be > 0, got " + value};
  return v;
}

std::vector<int32_t> parse_token_list(const std::string& flag, const std::string& value) {
  std::vector<int32_t> out;
  std::istringstream is(value);
  std::string item;
  while (std::getline(is, item, ',')) out.push_back(int32_t(parse_int64(flag, item, 0, INT32_MAX)));
  // getline drops a last empty item, which ",," and ",1" would reject.
  if (out.empty() || value.back() == ',')
    throw UsageError{flag + ": expected comma-separated token ids, got '" + value + "'"};
  return out;
}

// No --model, and --weights has a config.json: the model is the one it describes.
bool model_from_config_json(const Options& opt) {
  return opt.model.empty() && !opt.weights.empty() && !hf_config_path(opt.weights).empty();
}

// The model served: --model's preset, else config.json's (model_from_config_json), else the
// preset `fallback`, which opt.model is then set to (empty when the model is config.json's).
ModelConfig choose_model(Options& opt, const std::string& fallback) {
  if (model_from_config_json(opt)) return read_hf_config(hf_config_path(opt.weights)).model;
  if (opt.model.empty()) opt.model = fallback;
  return model_config(opt.model, opt.num_kv_heads);
}

Options parse_args(int argc, char** argv) {
  Options opt;
  if (argc < 2) throw UsageError{"missing command (bench or generate)"};
  opt.command = argv[1];
  if (opt.command == "--help" || opt.command == "-h") return opt;
  if (opt.command != "bench" && opt.command != "generate")
    throw UsageError{"unknown command '" + opt.command + "' (expected bench or generate)"};
  static const std::vector<std::string> kCommon = {"--device", "--seed", "--weights", "--page-size", "--kv-layout",
                                                   "--cuda-graph", "--prefix-caching", "--model", "--num-kv-heads",
                                                   "--attention"};
  static const std::vector<std::string> kBench = {"--requests", "--prompt-len", "--output-len", "--kv-pool-gib",
                                                  "--csv", "--max-num-seqs", "--max-num-batched-tokens",
                                                  "--bandwidth-gbps"};
  static const std::vector<std::string> kGenerate = {"--prompt", "--max-new-tokens", "--temperature", "--top-k",
                                                     "--top-p"};
  const std::vector<std::string>& own = opt.command == "bench" ? kBench : kGenerate;
  for (int i = 2; i < argc; ++i) {
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
      opt.command = "--help";
      return opt;
    }
    const bool known = std::find(kCommon.begin(), kCommon.end(), flag) != kCommon.end() ||
                       std::find(own.begin(), own.end(), flag) != own.end();
    if (!known) throw UsageError{"unknown flag '" + flag + "' for " + opt.command};
    if (!has_value) {
      if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0) throw UsageError{flag + ": missing value"};
      value = argv[++i];
    }
    if (flag == "--device") opt.device = parse_choice(flag, value, {"auto", "cpu", "cuda"});
    else if (flag == "--seed") opt.seed = uint64_t(parse_int64(flag, value, 0, INT64_MAX));
    else if (flag == "--weights") opt.weights = parse_path(flag, value);
    else if (flag == "--page-size") opt.page_size = parse_int(flag, value, 1);
    else if (flag == "--kv-layout") opt.kv_layout = cli::parse_kv_layout(flag, value);
    else if (flag == "--cuda-graph") opt.cuda_graph = parse_bool01(flag, value);
    else if (flag == "--prefix-caching") opt.prefix_caching = parse_bool01(flag, value);
    else if (flag == "--model") opt.model = parse_choice(flag, value, model_names());
    else if (flag == "--num-kv-heads") opt.num_kv_heads = parse_int(flag, value, 1);
    else if (flag == "--attention") opt.attention = parse_choice(flag, value, attention_backend_names());
    else if (flag == "--requests") { opt.requests = parse_int(flag, value, 1); opt.requests_given = true; }
    else if (flag == "--prompt-len") { opt.prompt_len = parse_int(flag, value, 1); opt.prompt_len_given = true; }
    else if (flag == "--output-len") { opt.output_len = parse_int(flag, value, 1); opt.output_len_given = true; }
    else if (flag == "--kv-pool-gib") opt.kv_pool_gib = parse_positive(flag, value);
    else if (flag == "--csv") opt.csv = parse_path(flag, value);
    else if (flag == "--max-num-seqs") opt.max_num_seqs = parse_int(flag, value, 1);
    else if (flag == "--max-num-batched-tokens") opt.max_num_batched_tokens = parse_int(flag, value, 1);
    else if (flag == "--bandwidth-gbps") opt.bandwidth_gbps = parse_positive(flag, value);
    else if (flag == "--prompt") opt.prompt = parse_token_list(flag, value);
    else if (flag == "--max-new-tokens") opt.max_new_tokens = parse_int(flag, value, 1);
    else if (flag == "--temperature") {
      const double t = parse_double(flag, value, 0);
      if (t > double(std::numeric_limits<float>::max()))
        throw UsageError{"--temperature: " + value + " is past the float range the sampler takes"};
      if (t > 0 && float(t) == 0.f)  // would be greedy (temperature 0) without a word
        throw UsageError{"--temperature: " + value + " rounds to 0 in float (0 means greedy; pass 0 for that)"};
      opt.temperature = float(t);
    }
    else if (flag == "--top-k") opt.top_k = parse_int(flag, value);
    else if (flag == "--top-p") {
      opt.top_p = float(parse_double(flag, value, 0));
      if (opt.top_p <= 0.f || opt.top_p > 1.f) throw UsageError{"--top-p: must be in (0, 1], got " + value};
    }
  }
  if (opt.command == "generate" && opt.prompt.empty()) throw UsageError{"--prompt: missing (e.g. --prompt 1,2,3)"};
  if (opt.num_kv_heads != 0 && model_from_config_json(opt))
    throw UsageError{"--num-kv-heads: the model is --weights' " + hf_config_path(opt.weights) +
                     " (no --model given), whose num_key_value_heads are its K/V heads; --num-kv-heads "
                     "overrides a --model preset's only"};
  if (opt.command == "bench") opt.profile = parse_profile_window();
  return opt;
}

// "cpu" or "cuda" for --device auto|cpu|cuda.
std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
  return cuda_device_count() > 0 ? "cuda" : "cpu";
}

RunnerConfig runner_config(const Options& opt, const ModelConfig& model, const std::string& device) {
  if (device == "cpu") {
    const std::string source = opt.model.empty() ? "--weights " + opt.weights : "--model " + opt.model;
    GQ_CHECK(model.num_params() <= kCpuMaxParams, source, ": ", double(model.num_params()) / 1e9,
             "B parameters are too many for the CPU path (plain loops); use --model tiny or --device cuda");
  }
  RunnerConfig rc;
  rc.model = model;
  rc.weights.seed = opt.seed;
  rc.weights.path = opt.weights;
  rc.attention = opt.attention;
  rc.page_size = opt.page_size;
  rc.kv_layout = opt.kv_layout;
  rc.kv_pool_gib = opt.kv_pool_gib;
  rc.cuda_graph = opt.cuda_graph;
  return rc;
}

std::string csv_field(std::string s) {
  std::replace(s.begin(), s.end(), ',', ';');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

void append_csv(const std::string& path, const std::string& row) {
  bool need_header = true;
  {
    std::ifstream in(path);
    need_header = !in.good() || in.peek() == std::ifstream::traits_type::eof();
  }
  std::ofstream out(path, std::ios::app);
  GQ_CHECK(out.good(), "--csv: cannot write '", path, "'");
  if (need_header) out << kCsvHeader << '\n';
  out << row << '\n';
  GQ_CHECK(out.good(), "--csv: failed writing '", path, "'");
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

void print_progress(int64_t done, int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const double frac = total > 0 ? double(done) / double(total) : 1.0;
  const int filled = int(frac * kWidth);
  std::fprintf(stderr, "\r[%s%s] %3d%% %lld/%lld tokens %.1f s", std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '-').c_str(), int(frac * 100), static_cast<long long>(done),
               static_cast<long long>(total), seconds);
  std::fflush(stderr);
}

struct BenchResult {
  double seconds = 0, tokens_per_s = 0, mean_step_ms = 0, floor_s = 0, ratio = 0, pool_gib = 0;
  double mean_step_floor_ms = 0;  // the decode-only steps' floor, averaged
  double mean_launch_ms = 0;      // their host time before the launch, and waiting for the tokens
  double mean_wait_ms = 0;
  int decode_steps = 0;
  int num_graphs = 0;
  int64_t preemptions = 0;
};

BenchResult run_bench(const Options& opt, const ModelConfig& model, const std::string& device) {
  std::unique_ptr<Compute> compute = make_compute(device);
  const bool measured = opt.bandwidth_gbps <= 0;
  const double bandwidth = measured ? compute->measure_read_bandwidth_gbps() : opt.bandwidth_gbps;
  std::printf("read bandwidth %.0f GB/s (%s)\n", bandwidth, measured ? "measured: streaming read" : "--bandwidth-gbps");

  RunnerConfig rc = runner_config(opt, model, device);
  rc.max_num_seqs = opt.max_num_seqs > 0 ? opt.max_num_seqs : opt.requests;
  rc.max_num_batched_tokens = opt.max_num_batched_tokens > 0 ? opt.max_num_batched_tokens
                                                             : std::max(kDefaultBatchedTokens, rc.max_num_seqs);
  rc.max_model_len = int64_t(opt.prompt_len) + opt.output_len;
  std::fflush(stdout);
  Engine engine(std::make_unique<ModelRunner>(std::move(compute), rc), opt.prefix_caching,
                !env_flag("GQATTN_DISABLE_STEP_OVERLAP"));
  ModelRunner& runner = engine.runner();
  BenchResult r;
  r.pool_gib = double(runner.kv_pool_bytes()) / kGiB;
  std::printf("model %s (%d query heads, %d K/V heads, group %d), attention %s, %s, %d requests x (%d prompt + %d "
              "generated) tokens, page %d %s, K/V pool %.3g GiB (%d pages), weights %.3g GB\n",
              model.name.c_str(), model.num_qo_heads, model.num_kv_heads, model.group_size(), opt.attention.c_str(),
              device.c_str(), opt.requests, opt.prompt_len, opt.output_len, runner.page_size(),
              layout_name(opt.kv_layout), r.pool_gib, runner.num_pages(), double(runner.weight_bytes()) / 1e9);
  std::fflush(stdout);

  SamplingParams params;
  params.max_new_tokens = opt.output_len;
  params.ignore_eos = true;
  for (int i = 0; i < opt.requests; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(opt.prompt_len));
    for (int t = 0; t < opt.prompt_len; ++t)
      prompt[size_t(t)] =
          int32_t(random_bits(opt.seed, kPromptStream + uint64_t(i), uint64_t(t)) % uint64_t(model.vocab_size));
    engine.add_request(prompt, params);
  }

  const int64_t kv_bytes_per_token = model.kv_bytes_per_token(int(dtype_size(runner.compute().act_dtype())));
  const double bytes_per_second = bandwidth * 1e9;
  const int64_t total_tokens = int64_t(opt.requests) * opt.output_len;
  int64_t generated = 0;
  double decode_seconds = 0, decode_floor = 0, decode_launch = 0, decode_wait = 0, last_progress = -1;
  const ProfileWindow& profile = opt.profile;
  for (int64_t step = 0; engine.has_unfinished(); ++step) {
    if (step == profile.first) runner.compute().set_profiling(true);
    const StepStats s = engine.step();
    if (step == profile.first + profile.count - 1) runner.compute().set_profiling(false);
    r.seconds += s.seconds;
    generated += s.num_sampled;
    r.preemptions += s.num_preempted;
    const double bytes_read = double(runner.weight_bytes()) + double(s.kv_tokens) * double(kv_bytes_per_token);
    const double floor = bytes_read / bytes_per_second;
    r.floor_s += floor;
    if (s.decode_only()) {
      decode_seconds += s.seconds;
      decode_floor += floor;
      decode_launch += s.launch_seconds;
      decode_wait += s.wait_seconds;
      ++r.decode_steps;
    }
    if (r.seconds - last_progress >= kProgressSeconds || !engine.has_unfinished()) {
      print_progress(generated, total_tokens, r.seconds);
      last_progress = r.seconds;
    }
  }
  std::fprintf(stderr, "\n");
  r.tokens_per_s = double(generated) / r.seconds;
  r.mean_step_ms = r.decode_steps > 0 ? decode_seconds / r.decode_steps * 1e3 : 0;
  r.mean_step_floor_ms = r.decode_steps > 0 ? decode_floor / r.decode_steps * 1e3 : 0;
  r.mean_launch_ms = r.decode_steps > 0 ? decode_launch / r.decode_steps * 1e3 : 0;
  r.mean_wait_ms = r.decode_steps > 0 ? decode_wait / r.decode_steps * 1e3 : 0;
  r.ratio = r.seconds / r.floor_s;
  r.num_graphs = runner.compute().num_graphs();
  return r;
}

int bench(const Options& given) {
  Options opt = given;
  const std::string device = resolve_device(opt.device);
  const ModelConfig model = choose_model(opt, device == "cpu" ? "tiny" : "llama2-7b");
  // On the CPU each size not given takes its CPU default (one given flag keeps the others small).
  if (device == "cpu" && !(opt.requests_given && opt.prompt_len_given && opt.output_len_given)) {
    if (!opt.requests_given) opt.requests = kCpuRequests;
    if (!opt.prompt_len_given) opt.prompt_len = kCpuPromptLen;
    if (!opt.output_len_given) opt.output_len = kCpuOutputLen;
    std::printf("no GPU in use: running the %s model on the CPU at a small size (%d requests x (%d + %d) tokens); "
                "pass --requests/--prompt-len/--output-len to change it\n",
                model.name.c_str(), opt.requests, opt.prompt_len, opt.output_len);
  }
  std::string status = "ok";
  BenchResult r;
  try {
    r = run_bench(opt, model, device);
  } catch (const Error& e) {
    status = std::string("error: ") + e.what();
  }
  if (status == "ok") {
    std::printf("total            %.2f s\n", r.seconds);
    std::printf("output tokens/s  %.0f\n", r.tokens_per_s);
    std::printf("mean decode step %.3f ms over %d decode-only steps (floor %.3f ms, ratio %.2f)\n", r.mean_step_ms,
                r.decode_steps, r.mean_step_floor_ms, r.mean_step_floor_ms > 0 ? r.mean_step_ms / r.mean_step_floor_ms : 0);
    std::printf("host per step    %.3f ms until forward() returns (the launches; on the CPU the pass itself), "
                "%.3f ms after the tokens, %.3f ms waiting for them (decode-only steps)\n",
                r.mean_launch_ms, r.mean_step_ms - r.mean_launch_ms - r.mean_wait_ms, r.mean_wait_ms);
    std::printf("floor            %.2f s ((weight bytes + K/V bytes read) / bandwidth, over every step)\n", r.floor_s);
    std::printf("ratio to floor   %.2f (total / floor)\n", r.ratio);
    std::printf("preemptions      %lld\n", static_cast<long long>(r.preemptions));
    std::printf("CUDA graphs      %d captured\n", r.num_graphs);
  }
  if (!opt.csv.empty()) {
    const bool ok = status == "ok";
    std::ostringstream row;
    row << model.name << ',' << model.num_kv_heads << ',' << opt.attention << ',' << opt.requests << ','
        << opt.prompt_len << ',' << opt.output_len << ',' << (ok ? fmt(r.pool_gib, 2) : fmt(opt.kv_pool_gib, 2)) << ','
        << (ok ? fmt(r.seconds, 3) : "") << ',' << (ok ? fmt(r.tokens_per_s, 1) : "") << ','
        << (ok ? fmt(r.mean_step_ms, 3) : "") << ',' << (ok ? fmt(r.floor_s, 3) : "") << ','
        << (ok ? fmt(r.ratio, 3) : "") << ',' << csv_field(status);
    append_csv(opt.csv, row.str());
    std::printf("appended a row to %s\n", opt.csv.c_str());
  }
  if (status != "ok") throw Error(status.substr(7));
  return 0;
}

int generate(const Options& given) {
  Options opt = given;
  const std::string device = resolve_device(opt.device);
  const ModelConfig model = choose_model(opt, "tiny");
  RunnerConfig rc = runner_config(opt, model, device);
  rc.max_num_seqs = 1;
  rc.max_num_batched_tokens = std::max(kDefaultBatchedTokens, int(opt.prompt.size()));
  rc.max_model_len = int64_t(opt.prompt.size()) + opt.max_new_tokens;
  EngineConfig ec;
  ec.runner = rc;
  ec.device = device;
  ec.enable_prefix_caching = opt.prefix_caching;
  ec.overlap_steps = !env_flag("GQATTN_DISABLE_STEP_OVERLAP");
  Engine engine(ec);
  SamplingParams params;
  params.max_new_tokens = opt.max_new_tokens;
  params.temperature = opt.temperature;
  params.top_k = opt.top_k;
  params.top_p = opt.top_p;
  params.seed = opt.seed;
  const std::vector<int32_t> out = engine.generate({opt.prompt}, params)[0];
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace gqattn::engine

int main(int argc, char** argv) {
  using namespace gqattn::engine;
  Options opt;
  try {
    opt = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gqattn-serve: %s\nRun gqattn-serve --help for the flags.\n", e.message.c_str());
    return 2;
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "gqattn-serve: %s\n", e.what());
    return 2;
  }
  if (opt.command == "--help" || opt.command == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  try {
    return opt.command == "bench" ? bench(opt) : generate(opt);
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "gqattn-serve: %s\n", e.what());
    return 1;
  }
}
