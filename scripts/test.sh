#!/usr/bin/env bash
# Configures, builds and runs the whole test suite with ctest: the CPU oracle and API tests
# (label cpu), the CLI checks, and the GPU tests (label gpu, built when CUDA is; each skips
# with a message when no GPU is present); then pytest over tests/python when the Python
# extension was built. Extra arguments go to ctest (e.g. -L cpu).
# Env: GQATTN_BUILD_DIR, GQATTN_CUDA_ARCHS, GQATTN_HEAD_DIMS, GQATTN_DTYPES, GQATTN_PYTHON,
# GQATTN_SANITIZE (e.g. address,undefined: the host code under the sanitizers).
set -euo pipefail
# shellcheck source=scripts/build_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_env.sh"

gqattn_configure
gqattn_build
if ! gqattn_have_gpu; then
  echo "test.sh: no GPU found: the GPU tests (label gpu), if built, report as skipped"
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@"

# The Python tests (tests/python) against the extension in $BUILD_DIR/python, when it was built.
python_exe="$(gqattn_python_executable)"
if [[ -z "$python_exe" ]]; then
  echo "test.sh: the Python extension was not built (GQATTN_PYTHON=OFF, or nanobind not found: pip install nanobind); tests/python skipped"
elif ! "$python_exe" -c "import pytest" 2>/dev/null; then
  echo "test.sh: pytest is not installed for $python_exe (pip install pytest); tests/python skipped"
else
  rc=0
  PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$python_exe" -m pytest -q -rs -p no:cacheprovider "$GQATTN_ROOT/tests/python" || rc=$?
  # Exit code 5: no test was collected, which is not a failure here.
  if ((rc != 0 && rc != 5)); then exit "$rc"; fi
fi
