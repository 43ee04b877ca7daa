// gqattn._C: nanobind bindings of the C++ API (include/gqattn) over DLPack tensors.
// Layer: python/ (host-only). A tensor of any DLPack producer (torch, numpy, cupy, jax) becomes a
// TensorView without a copy; its device picks the backend (CPU tensors: the float64 CPU backend,
// CUDA tensors: the GPU kernels on the stream passed as an integer). gqattn::Error -> ValueError;
// a non-tensor or a dtype the argument can never take -> TypeError; both name the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "gqattn/attention.h"
#include "gqattn/error.h"
#include "gqattn/paged_kv.h"
#include "gqattn/tensor.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gqattn {
namespace {

using Array = nb::ndarray<>;
using ReadOnlyArray = nb::ndarray<nb::ro>;

// Which dtypes an argument may ever hold; a mismatch between arguments (q bf16, k fp16) is left
// to the C++ validation, which reports it as a ValueError.
enum class Accept { kAttention, kIndex, kFloat32 };

const char* accepted_names(Accept accept) {
  switch (accept) {
    case Accept::kAttention: return "bf16, fp16 or fp32";
    case Accept::kIndex: return "int32";
    case Accept::kFloat32: return "fp32";
  }
  return "";
}

// "float64", "int64", "bfloat16", ... for messages.
std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* prefix = "code";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: prefix = "int"; break;
    case nb::dlpack::dtype_code::UInt: prefix = "uint"; break;
    case nb::dlpack::dtype_code::Float: prefix = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: prefix = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: prefix = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  std::string name = prefix + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

bool to_dtype(nb::dlpack::dtype dt, DType& out) {
  if (dt.lanes != 1) return false;
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) out = DType::kBF16;
  else if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) out = DType::kFP16;
  else if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) out = DType::kFP32;
  else if (code == nb::dlpack::dtype_code::Int && dt.bits == 32) out = DType::kInt32;
  else return false;
  return true;
}

bool accepts(Accept accept, DType dtype) {
  switch (accept) {
    case Accept::kAttention: return dtype == DType::kBF16 || dtype == DType::kFP16 || dtype == DType::kFP32;
    case Accept::kIndex: return dtype == DType::kInt32;
    case Accept::kFloat32: return dtype == DType::kFP32;
  }
  return false;
}

std::string python_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// Why obj is not taken as a DLPack tensor: its type, and for a numpy array in the other byte order
// (which DLPack cannot describe) how to convert it.
std::string not_a_tensor(nb::handle obj) {
  std::string why = python_type_name(obj);
  if (nb::hasattr(obj, "dtype") && nb::hasattr(obj.attr("dtype"), "byteorder")) {
    nb::object order = obj.attr("dtype").attr("byteorder");
    if (nb::isinstance<nb::str>(order) && nb::cast<std::string>(order) == ">")
      why += " in big-endian byte order (DLPack holds native order: a.astype(a.dtype.newbyteorder('=')))";
  }
  return why;
}

// Holds the imported arrays of one call, so that the views' pointers stay valid until it returns.
class Tensors {
 public:
  // A required tensor argument. `writable`: an output (a read-only array is a TypeError).
  TensorView get(nb::handle obj, const char* arg, Accept accept, bool writable = false) {
    if (obj.is_none()) throw nb::type_error(detail::concat(arg, ": a tensor is required, got None").c_str());
    return import(obj, arg, accept, writable);
  }
  // An optional tensor argument: None gives an undefined view ("not given").
  TensorView optional(nb::handle obj, const char* arg, Accept accept, bool writable = false) {
    if (obj.is_none()) return TensorView{};
    return import(obj, arg, accept, writable);
  }

 private:
  TensorView import(nb::handle obj, const char* arg, Accept accept, bool writable) {
    nb::dlpack::dtype dt;
    TensorView v;
    int ndim = 0;
    const int64_t* shape = nullptr;
    const int64_t* strides = nullptr;
    int device_type = 0;
    if (writable) {
      Array a;
      if (!nb::try_cast(obj, a, false)) {
        ReadOnlyArray ro;
        if (nb::try_cast(obj, ro, false))
          throw nb::type_error(detail::concat(arg, ": must be writable (it is an output), got a read-only ",
                                              python_type_name(obj)).c_str());
        throw nb::type_error(detail::concat(arg, ": expected a DLPack tensor (torch, numpy, cupy, jax), got ",
                                            not_a_tensor(obj)).c_str());
      }
      dt = a.dtype(); ndim = int(a.ndim()); shape = a.shape_ptr(); strides = a.stride_ptr();
      device_type = a.device_type(); v.device_id = a.device_id(); v.data = a.data();
      writable_.push_back(std::move(a));
    } else {
      ReadOnlyArray a;
      if (!nb::try_cast(obj, a, false))
        throw nb::type_error(detail::concat(arg, ": expected a DLPack tensor (torch, numpy, cupy, jax), got ",
                                            not_a_tensor(obj)).c_str());
      dt = a.dtype(); ndim = int(a.ndim()); shape = a.shape_ptr(); strides = a.stride_ptr();
      device_type = a.device_type(); v.device_id = a.device_id();
      v.data = const_cast<void*>(static_cast<const void*>(a.data()));
      read_only_.push_back(std::move(a));
    }
    if (!to_dtype(dt, v.dtype) || !accepts(accept, v.dtype))
      throw nb::type_error(detail::concat(arg, ": dtype ", dlpack_dtype_name(dt), " is not supported (expected ",
                                          accepted_names(accept), ")").c_str());
    if (device_type == nb::device::cpu::value) {
      v.device = Device::kCPU;
      v.device_id = 0;
    } else if (device_type == nb::device::cuda::value) {
      v.device = Device::kCUDA;
    } else {
      throw nb::value_error(detail::concat(arg, ": DLPack device type ", device_type,
                                           " is not supported (expected cpu or cuda)").c_str());
    }
    if (ndim < 1 || ndim > kMaxDims)
      throw nb::value_error(detail::concat(arg, ": expected 1 to ", kMaxDims, " dims, got ", ndim).c_str());
    v.ndim = ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; ++d) {
      v.shape[d] = shape[d];
      v.strides[d] = strides[d];
      numel *= shape[d];
    }
    // An empty tensor's strides are arbitrary (numpy exports zeros); give it row-major ones.
    if (numel == 0) {
      int64_t stride = 1;
      for (int d = ndim - 1; d >= 0; --d) {
        v.strides[d] = stride;
        stride *= std::max<int64_t>(v.shape[d], 1);
      }
    }
    return v;
  }

  std::vector<Array> writable_;
  std::vector<ReadOnlyArray> read_only_;
};

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kFP16;
  if (name == "fp32") return DType::kFP32;
  throw nb::value_error(("dtype: unknown '" + name + "' (expected bf16, fp16 or fp32)").c_str());
}

KVLayout parse_layout(const std::string& name) {
  if (name == "NHD") return KVLayout::kNHD;
  if (name == "HND") return KVLayout::kHND;
  throw nb::value_error(("kv_layout: unknown '" + name + "' (expected \"NHD\" or \"HND\")").c_str());
}

void* as_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// The workspace tensor decides the plan's device; None plans for the CPU (which needs no workspace).
// The caller keeps the workspace alive as long as the plan (the Python wrappers hold both).
void plan_device(nb::handle workspace, PlanInputs& in, Workspace& ws) {
  if (workspace.is_none()) {
    in.device = Device::kCPU;
    return;
  }
  Array a;
  if (!nb::try_cast(workspace, a, false))
    throw nb::type_error(("workspace: expected a writable DLPack tensor, got " + python_type_name(workspace)).c_str());
  if (a.device_type() == nb::device::cpu::value) {
    in.device = Device::kCPU;
  } else if (a.device_type() == nb::device::cuda::value) {
    in.device = Device::kCUDA;
    in.device_id = a.device_id();
  } else {
    throw nb::value_error(detail::concat("workspace: DLPack device type ", a.device_type(),
                                         " is not supported (expected cpu or cuda)").c_str());
  }
  ws.data = a.data();
  ws.bytes = a.nbytes();
}

// The PlanInputs fields that decode_plan and prefill_plan share; the workspace picks the device.
PlanInputs plan_inputs(nb::handle workspace, Workspace& ws, const std::string& dtype, int num_qo_heads,
                       int num_kv_heads, int head_dim, int page_size, std::vector<int32_t> kv_indptr,
                       std::vector<int32_t> kv_last_page_len, std::vector<int32_t> kv_page_indices,
                       int64_t num_pages, bool enable_cuda_graph, int max_num_splits, bool graph_per_split,
                       int fixed_split_size) {
  PlanInputs in;
  plan_device(workspace, in, ws);
  in.dtype = parse_dtype(dtype);
  in.num_qo_heads = num_qo_heads;
  in.num_kv_heads = num_kv_heads;
  in.head_dim = head_dim;
  in.page_size = page_size;
  in.kv_indptr = std::move(kv_indptr);
  in.kv_last_page_len = std::move(kv_last_page_len);
  in.kv_page_indices = std::move(kv_page_indices);
  in.num_pages = num_pages;
  in.enable_cuda_graph = enable_cuda_graph;
  in.max_num_splits = max_num_splits;
  in.graph_per_split = graph_per_split;
  in.fixed_split_size = fixed_split_size;
  return in;
}


// Python parameter names of a paged K/V source, for the binding's own messages.
struct PagedNames {
  const char* k_pages;
  const char* v_pages;
  const char* kv_page_indptr;
};

PagedKV make_paged(Tensors& t, const PagedNames& names, nb::handle k_pages, nb::handle v_pages,
                   nb::handle kv_page_indptr, nb::handle kv_page_indices, nb::handle kv_last_page_len,
                   const std::string& kv_layout) {
  PagedKV kv;
  kv.layout = parse_layout(kv_layout);
  kv.k_pages = t.get(k_pages, names.k_pages, Accept::kAttention);
  kv.v_pages = t.get(v_pages, names.v_pages, Accept::kAttention);
  kv.kv_page_indptr = t.get(kv_page_indptr, names.kv_page_indptr, Accept::kIndex);
  kv.kv_page_indices = t.get(kv_page_indices, "kv_page_indices", Accept::kIndex);
  kv.kv_last_page_len = t.get(kv_last_page_len, "kv_last_page_len", Accept::kIndex);
  return kv;
}

const char* device_str(Device d) { return d == Device::kCUDA ? "cuda" : "cpu"; }

// The C++ validation names arguments as the C++ structs do (o, kv.k_pages, paged.kv_page_indptr,
// ragged.k); a rejected call is re-raised with the Python parameter names (out, k_pages, kv_indptr, k).
using Renames = std::vector<std::pair<std::regex, std::string>>;

const Renames& decode_renames() {
  static const Renames r = {{std::regex("^o:"), "out:"}, {std::regex("\\(o is "), "(out is "},
                            {std::regex("\\bkv\\."), ""}};
  return r;
}
const Renames& paged_prefill_renames() {
  static const Renames r = {{std::regex("^o:"), "out:"},
                            {std::regex("\\(o is "), "(out is "},
                            {std::regex("\\bpaged\\.k_pages\\b"), "k"},
                            {std::regex("\\bpaged\\.v_pages\\b"), "v"},
                            {std::regex("\\bpaged\\.kv_page_indptr\\b"), "kv_indptr"},
                            {std::regex("\\bpaged\\."), ""}};
  return r;
}
// decode_plan's page indptr is kv_page_indptr in Python (PlanInputs::kv_indptr in C++).
const Renames& decode_plan_renames() {
  static const Renames r = {{std::regex("\\bkv_indptr \\(page indptr\\)"), "kv_page_indptr"},
                            {std::regex("\\bkv_indptr\\b"), "kv_page_indptr"}};
  return r;
}
const Renames& ragged_prefill_renames() {
  static const Renames r = {{std::regex("^o:"), "out:"}, {std::regex("\\(o is "), "(out is "},
                            {std::regex("\\bragged\\."), ""}};
  return r;
}

template <typename Fn>
void call_renamed(const Renames& renames, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    std::string message = e.what();
    for (const auto& [pattern, replacement] : renames) message = std::regex_replace(message, pattern, replacement);
    throw Error(message);
  }
}

}  // namespace
}  // namespace gqattn

NB_MODULE(_C, m) {
  using namespace gqattn;
  m.doc() = "gqattn: grouped-query attention over a paged KV cache (bindings of the C++ API)";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const bool cuda_failure = std::strncmp(e.what(), "CUDA error", 10) == 0;
      PyErr_SetString(cuda_failure ? PyExc_RuntimeError : PyExc_ValueError, e.what());
    }
  });

  m.attr("kRecommendedWorkspaceBytes") = kRecommendedWorkspaceBytes;

  nb::class_<Plan>(m, "Plan", "What decode_plan / prefill_plan decided; pass it to the matching run.")
      .def_prop_ro("device", [](const Plan& p) { return device_str(p.device); })
      .def_ro("device_id", &Plan::device_id)
      .def_prop_ro("dtype", [](const Plan& p) { return dtype_name(p.dtype); })
      .def_ro("batch", &Plan::batch)
      .def_ro("num_qo_heads", &Plan::num_qo_heads)
      .def_ro("num_kv_heads", &Plan::num_kv_heads)
      .def_ro("head_dim", &Plan::head_dim)
      .def_ro("page_size", &Plan::page_size)
      .def_ro("num_pages", &Plan::num_pages)
      .def_ro("causal", &Plan::causal)
      .def_ro("is_decode", &Plan::is_decode)
      .def_ro("total_qo", &Plan::total_qo)
      .def_ro("qo_indptr", &Plan::qo_indptr)
      .def_ro("kv_len", &Plan::kv_len)
      .def_ro("kernel_id", &Plan::kernel_id)
      .def_ro("cta_rows", &Plan::cta_rows)
      .def_ro("kv_chunk", &Plan::kv_chunk)
      .def_ro("num_work", &Plan::num_work)
      .def_ro("num_ctas", &Plan::num_ctas)
      .def_ro("max_splits", &Plan::max_splits)
      .def_ro("split", &Plan::split)
      .def_ro("workspace_bytes_used", &Plan::workspace_bytes_used)
      .def("__repr__", [](const Plan& p) {
        return detail::concat("Plan(", p.is_decode ? "decode" : "prefill", ", ", device_str(p.device), ":",
                              p.device_id, ", ", dtype_name(p.dtype), ", batch=", p.batch, ", num_qo_heads=",
                              p.num_qo_heads, ", num_kv_heads=", p.num_kv_heads, ", head_dim=", p.head_dim,
                              ", page_size=", p.page_size, ", causal=", p.causal ? "True" : "False",
                              ", total_qo=", p.total_qo, ")");
      });

  m.def(
      "decode_plan",
      [](nb::handle workspace, std::vector<int32_t> kv_page_indptr, std::vector<int32_t> kv_last_page_len,
         int num_qo_heads, int num_kv_heads, int head_dim, int page_size, int qo_len, const std::string& dtype,
         bool enable_cuda_graph, int max_num_splits, std::vector<int32_t> kv_page_indices, int64_t num_pages,
         uintptr_t stream, bool graph_per_split, int fixed_split_size) {
        Workspace ws;
        PlanInputs in = plan_inputs(workspace, ws, dtype, num_qo_heads, num_kv_heads, head_dim, page_size,
                                    std::move(kv_page_indptr), std::move(kv_last_page_len),
                                    std::move(kv_page_indices), num_pages, enable_cuda_graph, max_num_splits,
                                    graph_per_split, fixed_split_size);
        in.qo_len = qo_len;
        Plan plan;
        call_renamed(decode_plan_renames(), [&] { plan = decode_plan(in, ws, as_stream(stream)); });
        return plan;
      },
      "workspace"_a.none(), "kv_page_indptr"_a, "kv_last_page_len"_a, "num_qo_heads"_a, "num_kv_heads"_a,
      "head_dim"_a, "page_size"_a, "qo_len"_a = 1, "dtype"_a = "bf16", "enable_cuda_graph"_a = false,
      "max_num_splits"_a = 0, "kv_page_indices"_a = std::vector<int32_t>{}, "num_pages"_a = -1, "stream"_a = 0,
      "graph_per_split"_a = false, "fixed_split_size"_a = 0,
      "Plans a decode step on the host (gqattn::decode_plan). The workspace's device picks the backend.");

  m.def(
      "prefill_plan",
      [](nb::handle workspace, std::vector<int32_t> qo_indptr, std::vector<int32_t> kv_indptr,
         std::vector<int32_t> kv_last_page_len, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
         bool causal, const std::string& dtype, bool enable_cuda_graph, int max_num_splits,
         std::vector<int32_t> kv_page_indices, int64_t num_pages, uintptr_t stream, bool graph_per_split,
         int fixed_split_size) {
        Workspace ws;
        PlanInputs in = plan_inputs(workspace, ws, dtype, num_qo_heads, num_kv_heads, head_dim, page_size,
                                    std::move(kv_indptr), std::move(kv_last_page_len), std::move(kv_page_indices),
                                    num_pages, enable_cuda_graph, max_num_splits, graph_per_split, fixed_split_size);
        in.causal = causal;
        in.qo_indptr = std::move(qo_indptr);
        return prefill_plan(in, ws, as_stream(stream));
      },
      "workspace"_a.none(), "qo_indptr"_a, "kv_indptr"_a, "kv_last_page_len"_a, "num_qo_heads"_a,
      "num_kv_heads"_a, "head_dim"_a, "page_size"_a, "causal"_a = false, "dtype"_a = "bf16",
      "enable_cuda_graph"_a = false, "max_num_splits"_a = 0, "kv_page_indices"_a = std::vector<int32_t>{},
      "num_pages"_a = -1, "stream"_a = 0, "graph_per_split"_a = false, "fixed_split_size"_a = 0,
      "Plans a prefill batch on the host (gqattn::prefill_plan); page_size 0 means ragged K/V.");

  m.def(
      "decode_run",
      [](const Plan& plan, nb::handle q, nb::handle k_pages, nb::handle v_pages, nb::handle kv_page_indptr,
         nb::handle kv_page_indices, nb::handle kv_last_page_len, nb::handle out, nb::handle lse,
         const std::string& kv_layout, float sm_scale, uintptr_t stream) {
        Tensors t;
        DecodeArgs args;
        args.q = t.get(q, "q", Accept::kAttention);
        args.kv = make_paged(t, {"k_pages", "v_pages", "kv_page_indptr"}, k_pages, v_pages, kv_page_indptr,
                             kv_page_indices, kv_last_page_len, kv_layout);
        args.o = t.get(out, "out", Accept::kAttention, true);
        args.lse = t.optional(lse, "lse", Accept::kFloat32, true);
        args.sm_scale = sm_scale;
        nb::gil_scoped_release release;
        call_renamed(decode_renames(), [&] { decode_run(plan, args, as_stream(stream)); });
      },
      "plan"_a, "q"_a.none(), "k_pages"_a.none(), "v_pages"_a.none(), "kv_page_indptr"_a.none(),
      "kv_page_indices"_a.none(), "kv_last_page_len"_a.none(), "out"_a.none(), "lse"_a.none() = nb::none(),
      "kv_layout"_a = "NHD", "sm_scale"_a = 0.f, "stream"_a = 0,
      "Runs a planned decode (gqattn::decode_run) into out (and lse); allocates nothing.");

  m.def(
      "prefill_run_paged",
      [](const Plan& plan, nb::handle q, nb::handle qo_indptr, nb::handle k, nb::handle v, nb::handle kv_indptr,
         nb::handle kv_page_indices, nb::handle kv_last_page_len, nb::handle out, nb::handle lse, bool causal,
         const std::string& kv_layout, float sm_scale, uintptr_t stream) {
        Tensors t;
        PrefillArgs args;
        args.q = t.get(q, "q", Accept::kAttention);
        args.qo_indptr = t.get(qo_indptr, "qo_indptr", Accept::kIndex);
        args.paged = make_paged(t, {"k", "v", "kv_indptr"}, k, v, kv_indptr, kv_page_indices, kv_last_page_len,
                                kv_layout);
        args.o = t.get(out, "out", Accept::kAttention, true);
        args.lse = t.optional(lse, "lse", Accept::kFloat32, true);
        args.causal = causal;
        args.sm_scale = sm_scale;
        nb::gil_scoped_release release;
        call_renamed(paged_prefill_renames(), [&] { prefill_run(plan, args, as_stream(stream)); });
      },
      "plan"_a, "q"_a.none(), "qo_indptr"_a.none(), "k"_a.none(), "v"_a.none(), "kv_indptr"_a.none(),
      "kv_page_indices"_a.none(), "kv_last_page_len"_a.none(), "out"_a.none(),
      "lse"_a.none() = nb::none(), "causal"_a = false, "kv_layout"_a = "NHD", "sm_scale"_a = 0.f, "stream"_a = 0,
      "Runs a planned prefill over paged K/V (gqattn::prefill_run); allocates nothing.");

  m.def(
      "prefill_run_ragged",
      [](const Plan& plan, nb::handle q, nb::handle qo_indptr, nb::handle k, nb::handle v, nb::handle kv_indptr,
         nb::handle out, nb::handle lse, bool causal, float sm_scale, uintptr_t stream) {
        Tensors t;
        PrefillArgs args;
        args.q = t.get(q, "q", Accept::kAttention);
        args.qo_indptr = t.get(qo_indptr, "qo_indptr", Accept::kIndex);
        args.ragged.k = t.get(k, "k", Accept::kAttention);
        args.ragged.v = t.get(v, "v", Accept::kAttention);
        args.ragged.kv_indptr = t.get(kv_indptr, "kv_indptr", Accept::kIndex);
        args.o = t.get(out, "out", Accept::kAttention, true);
        args.lse = t.optional(lse, "lse", Accept::kFloat32, true);
        args.causal = causal;
        args.sm_scale = sm_scale;
        nb::gil_scoped_release release;
        call_renamed(ragged_prefill_renames(), [&] { prefill_run(plan, args, as_stream(stream)); });
      },
      "plan"_a, "q"_a.none(), "qo_indptr"_a.none(), "k"_a.none(), "v"_a.none(), "kv_indptr"_a.none(),
      "out"_a.none(), "lse"_a.none() = nb::none(), "causal"_a = false, "sm_scale"_a = 0.f, "stream"_a = 0,
      "Runs a planned prefill over ragged K/V (gqattn::prefill_run); allocates nothing.");

  m.def(
      "append_kv",
      [](nb::handle k_pages, nb::handle v_pages, nb::handle kv_page_indptr, nb::handle kv_page_indices,
         nb::handle kv_last_page_len, nb::handle k_new, nb::handle v_new, nb::handle batch_indices,
         nb::handle positions, const std::string& kv_layout, uintptr_t stream) {
        Tensors t;
        PagedKV kv;
        kv.layout = parse_layout(kv_layout);
        kv.k_pages = t.get(k_pages, "k_pages", Accept::kAttention, true);
        kv.v_pages = t.get(v_pages, "v_pages", Accept::kAttention, true);
        kv.kv_page_indptr = t.get(kv_page_indptr, "kv_page_indptr", Accept::kIndex);
        kv.kv_page_indices = t.get(kv_page_indices, "kv_page_indices", Accept::kIndex);
        kv.kv_last_page_len = t.optional(kv_last_page_len, "kv_last_page_len", Accept::kIndex);
        const TensorView kn = t.get(k_new, "k_new", Accept::kAttention);
        const TensorView vn = t.get(v_new, "v_new", Accept::kAttention);
        const TensorView bi = t.get(batch_indices, "batch_indices", Accept::kIndex);
        const TensorView pos = t.get(positions, "positions", Accept::kIndex);
        nb::gil_scoped_release release;
        call_renamed(decode_renames(), [&] { append_kv(kv, kn, vn, bi, pos, as_stream(stream)); });
      },
      "k_pages"_a.none(), "v_pages"_a.none(), "kv_page_indptr"_a.none(), "kv_page_indices"_a.none(),
      "kv_last_page_len"_a.none(), "k_new"_a.none(), "v_new"_a.none(), "batch_indices"_a.none(),
      "positions"_a.none(), "kv_layout"_a = "NHD", "stream"_a = 0,
      "Writes new tokens' K/V into their page slots (gqattn::append_kv).");

  m.def(
      "merge_states",
      [](nb::handle v, nb::handle s, nb::handle v_merged, nb::handle s_merged, uintptr_t stream) {
        Tensors t;
        const TensorView vv = t.get(v, "v", Accept::kAttention);
        const TensorView sv = t.get(s, "s", Accept::kFloat32);
        const TensorView vm = t.get(v_merged, "v_merged", Accept::kAttention, true);
        const TensorView sm = t.optional(s_merged, "s_merged", Accept::kFloat32, true);
        nb::gil_scoped_release release;
        merge_states(vv, sv, vm, sm, as_stream(stream));
      },
      "v"_a.none(), "s"_a.none(), "v_merged"_a.none(), "s_merged"_a.none() = nb::none(), "stream"_a = 0,
      "Combines partial attention states over disjoint key sets (gqattn::merge_states).");

  m.def(
      "block_table_to_csr",
      [](std::vector<int32_t> pages, int batch, int max_pages, std::vector<int32_t> kv_len, int page_size) {
        BlockTable table;
        table.batch = batch;
        table.max_pages = max_pages;
        table.pages = std::move(pages);
        table.kv_len = std::move(kv_len);
        GQ_CHECK(batch >= 0 && max_pages >= 0, "block_table: batch (", batch, ") and max_pages (", max_pages,
                 ") must be >= 0");
        GQ_CHECK(table.pages.size() == size_t(batch) * size_t(max_pages), "block_table: holds ",
                 table.pages.size(), " entries, expected batch x max_pages = ", batch, " x ", max_pages);
        GQ_CHECK(table.kv_len.size() == size_t(batch), "kv_len: holds ", table.kv_len.size(),
                 " entries, expected batch = ", batch);
        PageTableCSR csr = block_table_to_csr(table, page_size);
        return std::make_tuple(std::move(csr.kv_page_indptr), std::move(csr.kv_page_indices),
                               std::move(csr.kv_last_page_len));
      },
      "pages"_a, "batch"_a, "max_pages"_a, "kv_len"_a, "page_size"_a,
      "Padded block table (row-major [batch, max_pages]) and kv_len -> (kv_page_indptr, kv_page_indices, "
      "kv_last_page_len).");

  m.def(
      "csr_to_block_table",
      [](std::vector<int32_t> kv_page_indptr, std::vector<int32_t> kv_page_indices,
         std::vector<int32_t> kv_last_page_len, int page_size) {
        PageTableCSR csr;
        csr.kv_page_indptr = std::move(kv_page_indptr);
        csr.kv_page_indices = std::move(kv_page_indices);
        csr.kv_last_page_len = std::move(kv_last_page_len);
        BlockTable table = csr_to_block_table(csr, page_size);
        return std::make_tuple(std::move(table.pages), table.batch, table.max_pages, std::move(table.kv_len));
      },
      "kv_page_indptr"_a, "kv_page_indices"_a, "kv_last_page_len"_a, "page_size"_a,
      "CSR page table -> (pages row-major [batch, max_pages], batch, max_pages, kv_len).");

  m.def(
      "build_info",
      []() {
        const BuildInfo info = build_info();
        nb::dict d;
        d["cuda"] = info.cuda;
        d["head_dims"] = info.head_dims;
        std::vector<std::string> dtypes;
        for (DType t : info.dtypes) dtypes.emplace_back(dtype_name(t));
        d["dtypes"] = dtypes;
        d["cuda_archs"] = info.cuda_archs;
        return d;
      },
      "What this build compiled: {'cuda': bool, 'head_dims': [...], 'dtypes': [...], 'cuda_archs': [...]}.");

  m.def("cuda_device_count", &cuda_device_count, "Usable CUDA devices (0 without CUDA support or a GPU).");
}
