# shellcheck shell=bash
# Sourced by scripts/run.sh and scripts/test.sh (not a command of its own): configures the CMake
# build in $GQATTN_BUILD_DIR (default build) with Ninja, passing GQATTN_CUDA, GQATTN_CUDA_ARCHS,
# GQATTN_HEAD_DIMS, GQATTN_DTYPES, GQATTN_PYTHON and GQATTN_SANITIZE to CMake when they are set and
# CMake's defaults when they are not (not what an earlier configure of the same build directory
# cached), and builds with every core. scripts/gpu_check.sh and scripts/clock_probe.sh source it for
# its GPU helpers.

GQATTN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${GQATTN_BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$GQATTN_ROOT/$BUILD_DIR" ;; esac
JOBS="$(nproc 2>/dev/null || echo 2)"

# Prints one CMake argument a line for each cache variable named: -DVAR=value where the environment
# sets VAR, else -UVAR (CMake's default again, not the value a build directory kept from an earlier
# configure with other settings, e.g. .ci/run's one head dim).
gqattn_cache_args() {
  local v
  for v in "$@"; do
    if [[ -n "${!v:-}" ]]; then printf '%s\n' "-D$v=${!v}"; else printf '%s\n' "-U$v"; fi
  done
}

gqattn_configure() {
  local args=(-S "$GQATTN_ROOT" -B "$BUILD_DIR" -G Ninja)
  mapfile -t -O "${#args[@]}" args < <(gqattn_cache_args GQATTN_CUDA GQATTN_CUDA_ARCHS GQATTN_HEAD_DIMS \
    GQATTN_DTYPES GQATTN_PYTHON GQATTN_SANITIZE)
  # Debian's googletest package ships the sources; build them with our compiler flags.
  if [[ -n "${GQATTN_GTEST_SOURCE_DIR:-}" ]]; then
    args+=("-DGQATTN_GTEST_SOURCE_DIR=$GQATTN_GTEST_SOURCE_DIR")
  elif [[ -f /usr/src/googletest/CMakeLists.txt ]]; then
    args+=("-DGQATTN_GTEST_SOURCE_DIR=/usr/src/googletest")
  fi
  # The CUDA toolkit's usual home when nvcc is not on PATH.
  if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  cmake "${args[@]}"
}

gqattn_build() {
  cmake --build "$BUILD_DIR" -j "$JOBS" "$@"
}

# The nvidia-smi query fields FIELDS (comma-separated) as this driver names them: drivers older
# than the clocks_event_reasons.* names call them clocks_throttle_reasons.*.
gqattn_smi_fields() {
  if nvidia-smi --query-gpu="$1" --format=csv,noheader >/dev/null 2>&1; then echo "$1"
  else echo "${1//clocks_event_reasons/clocks_throttle_reasons}"; fi
}

# True when a CUDA GPU is visible to the driver.
gqattn_have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# The Python interpreter the extension gqattn._C was built for (empty when it was not built).
gqattn_python_executable() {
  sed -n 's/^GQATTN_PYTHON_EXECUTABLE:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null
}
