#!/usr/bin/env bash
# Configures, builds and runs the whole test suite with ctest: the CPU oracle and API tests
# (label cpu), the CLI checks, and the GPU tests (label gpu, built when CUDA is; each skips
# with a message when no GPU is present). Extra arguments go to ctest (e.g. -L cpu).
# Env: GQATTN_BUILD_DIR, GQATTN_CUDA_ARCHS, GQATTN_HEAD_DIMS, GQATTN_DTYPES.
set -euo pipefail
# shellcheck source=scripts/build_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_env.sh"

gqattn_configure
gqattn_build
if ! gqattn_have_gpu; then
  echo "test.sh: no GPU found: the GPU tests (label gpu), if built, report as skipped"
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@"
