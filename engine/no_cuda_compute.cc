// make_cuda_compute() in a build without CUDA: an error that names the CMake option.
// Layer: engine (host-only).
#include "compute.h"
#include "gqattn/error.h"

namespace gqattn::engine {

std::unique_ptr<Compute> make_cuda_compute(int) {
  throw Error("--device cuda: this build has no CUDA (configure with -DGQATTN_CUDA=ON)");
}

}  // namespace gqattn::engine
