#!/usr/bin/env bash
# gqattn as another project's dependency, both ways a CMake project takes it:
#  1. find_package: `cmake --install BUILD_DIR` into a temporary prefix (library, headers,
#     lib/cmake/gqattn), then examples/ configured on its own against that prefix, built and run;
#  2. add_subdirectory: a consumer project that adds the source tree (CPU-only, to stay quick),
#     gets the library alone (no gqattn-bench, no tests) and builds and runs the same example.
# Usage: scripts/check_install.sh BUILD_DIR CXX_COMPILER LIBDIR [SANITIZE]  (LIBDIR: the build's
# CMAKE_INSTALL_LIBDIR, e.g. lib, lib64, lib/x86_64-linux-gnu; SANITIZE: its GQATTN_SANITIZE list,
# with which the consumers then compile too). The ctest `install_and_find_package` runs it.
set -euo pipefail
build=$(cd "$1" && pwd)
cxx=$2
libdir=$3
sanitize=${4:-}
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Options every consumer's configure takes (never empty: "${a[@]}" of an empty array fails under
# set -u in bash < 4.4).
opts=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=$cxx")
command -v ninja >/dev/null 2>&1 && opts+=(-G Ninja)
if [[ -n "$sanitize" ]]; then
  opts+=("-DCMAKE_CXX_FLAGS=-fsanitize=$sanitize -fno-sanitize-recover=all"
         "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=$sanitize")
fi

echo "check_install: cmake --install $build"
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
for f in include/gqattn/attention.h include/gqattn/paged_kv.h include/gqattn/tensor.h include/gqattn/error.h \
         "$libdir/cmake/gqattn/gqattnConfig.cmake" "$libdir/cmake/gqattn/gqattnConfigVersion.cmake"; do
  [[ -f "$tmp/prefix/$f" ]] || { echo "check_install: $f was not installed"; cat "$tmp/install.log"; exit 1; }
done
ls "$tmp/prefix/$libdir"/libgqattn.* > /dev/null 2>&1 || { echo "check_install: no libgqattn in $libdir"; exit 1; }

echo "check_install: examples/ against the installed package (find_package(gqattn CONFIG))"
# A libdir that the platform's find_package does not search under a prefix (lib64 on Debian) is
# named directly.
find_opts=(-DCMAKE_PREFIX_PATH="$tmp/prefix")
[[ $libdir == lib ]] || find_opts+=(-Dgqattn_DIR="$tmp/prefix/$libdir/cmake/gqattn")
cmake -S examples -B "$tmp/find" "${opts[@]}" "${find_opts[@]}" > "$tmp/find.log" 2>&1 || { cat "$tmp/find.log"; exit 1; }
cmake --build "$tmp/find" > "$tmp/find_build.log" 2>&1 || { cat "$tmp/find_build.log"; exit 1; }
"$tmp/find/decode_paged"
"$tmp/find/prefill_chunked"
if [[ -x "$tmp/find/decode_paged_cuda" ]]; then  # a CUDA build's package: 77 where no GPU is present
  rc=0; "$tmp/find/decode_paged_cuda" || rc=$?
  [[ $rc == 0 || $rc == 77 ]] || exit 1
fi

echo "check_install: a consumer project that add_subdirectory()s the source tree (CPU-only)"
mkdir "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(gqattn_consumer LANGUAGES CXX)
set(GQATTN_CUDA OFF CACHE STRING "" FORCE)
add_subdirectory("$root" gqattn)
foreach(t gqattn-bench gqattn-serve gqattn_cpu_tests gqattn_C)
  if(TARGET \${t})
    message(FATAL_ERROR "a subproject build made \${t}: only the library is wanted")
  endif()
endforeach()
add_executable(decode_paged "$root/examples/decode_paged.cc")
target_link_libraries(decode_paged PRIVATE gqattn::gqattn)
EOF
cmake -S "$tmp/consumer" -B "$tmp/sub" "${opts[@]}" > "$tmp/sub.log" 2>&1 || { cat "$tmp/sub.log"; exit 1; }
cmake --build "$tmp/sub" > "$tmp/sub_build.log" 2>&1 || { cat "$tmp/sub_build.log"; exit 1; }
"$tmp/sub/decode_paged"
echo "check_install: both ways work"
