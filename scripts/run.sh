#!/usr/bin/env bash
# Configures and builds gqattn-bench if needed, then runs its default job: Llama-2-7B attention
# shapes (MHA, GQA-8, MQA), decode and prefill, on the GPU when one is present, otherwise on the
# CPU backend at a small size (the binary says which). Extra arguments go to gqattn-bench
# (e.g. scripts/run.sh --csv results.csv). Env: GQATTN_BUILD_DIR, GQATTN_CUDA_ARCHS,
# GQATTN_HEAD_DIMS, GQATTN_DTYPES.
set -euo pipefail
# shellcheck source=scripts/build_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_env.sh"

gqattn_configure
gqattn_build --target gqattn-bench
exec "$BUILD_DIR/gqattn-bench" "$@"
