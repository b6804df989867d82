#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-server, llama-bench, llama-quantize, llama-cli,
# llama-speculative-simple) from the llama.cpp source vendored in the llama-cpp-python sdist
# on PyPI, for the bench peer `llamaserver-*` and scripts/quant_scale.py. Outside the repo,
# once per machine; never in CI. Where GitHub is reachable a git checkout does as well.
#
#   scripts/build_llama_cpp.sh [--dir DIR] [--version X.Y.Z] [--flags native|avx512] [--jobs N]
#
# --flags native: -march=native (GGML_NATIVE=ON), the fastest on the machine that builds it.
# --flags avx512: a portable AVX-512 build (GGML_NATIVE=OFF with AVX2, FMA, F16C, BMI2 and
#   AVX-512 F/VBMI/VNNI/BF16 named), without AMX, whose kernels crashed on an AMX Xeon.
# DIR/READY then lists `name=absolute path` of every tool, plus the sdist's version and the
# llama.cpp commit it vendors; verispec finds llama-server through it (VERISPEC_LLAMA_CPP_DIR,
# default ~/.cache/verispec/llama.cpp) or through VERISPEC_LLAMA_SERVER.
set -euo pipefail

dir="${VERISPEC_LLAMA_CPP_DIR:-$HOME/.cache/verispec/llama.cpp}"
version=""
flags="native"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --flags) flags="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$flags" in
  native) cpu_args=(-DGGML_NATIVE=ON) ;;
  avx512) cpu_args=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
                    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON) ;;
  *) echo "--flags must be native or avx512, not $flags" >&2; exit 2 ;;
esac

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
cd "$dir"
spec="llama-cpp-python${version:+==$version}"
# --no-binary: the sdist, which holds llama.cpp's source under vendor/llama.cpp. pip names
# the file it saved, or the one it already had.
sdist="$(python3 -m pip download --no-deps --no-binary :all: "$spec" -d "$dir" \
  | grep -o 'llama_cpp_python-[0-9][^ /]*\.tar\.gz' | tail -1)"
[ -n "$sdist" ] || { echo "pip download $spec named no sdist" >&2; exit 1; }
version="${sdist#llama_cpp_python-}"
version="${version%.tar.gz}"
src="$dir/llama_cpp_python-$version"
[ -d "$src" ] || tar xzf "$sdist"
llama="$src/vendor/llama.cpp"
# The sdist records the llama.cpp commit it vendors only in its changelog.
commit="$(sed -n "/^## \[$version\]/,/^## \[/p" "$src/CHANGELOG.md" \
  | grep -o 'ggml-org/llama.cpp@[0-9a-f]*' | head -1 | cut -d@ -f2)"
commit="${commit:-unknown}"

build="$dir/build-$version-$flags"
# No web UI (it would be fetched from Hugging Face at build time), no HTTPS client, no
# tests: only the tools below.
cmake -S "$llama" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$commit" "${cpu_args[@]}" >"$build.cmake.log"
targets=(llama-server llama-bench llama-quantize llama-cli)
[ -d "$llama/examples/speculative-simple" ] && targets+=(llama-speculative-simple)
cmake --build "$build" --config Release -j "$jobs" --target "${targets[@]}"

# A build can compile and still fault on this CPU: -march=native on an AMX Xeon compiles
# llama.cpp's AMX int8 kernels, which died with SIGILL at their first tile load on prompt
# batches here (0.3.36; llama.cpp PR #26954). One short run on the embedded default model,
# where it is installed, catches that before READY names the build.
model="$(python3 -c 'from verispec.models.loading import default_gguf_path; print(default_gguf_path())' 2>/dev/null || true)"
if [ -n "$model" ] && [ -f "$model" ]; then
  status=0
  "$build/bin/llama-bench" -m "$model" -p 16 -n 2 -r 1 -t 1 >"$build.smoke.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    echo "$build/bin/llama-bench failed on $model (exit $status; log $build.smoke.log)." >&2
    if [ "$status" -eq 132 ] && [ "$flags" = native ]; then
      echo "SIGILL: an instruction this build chose faults on this CPU. On AMX Xeons that is" >&2
      echo "llama.cpp's AMX kernels; build the portable AVX-512 one: $0 --flags avx512" >&2
    fi
    exit 1
  fi
fi

ready="$dir/READY"
{
  for t in "${targets[@]}"; do
    "$build/bin/$t" --version >/dev/null 2>&1 || [ "$t" = llama-quantize ] \
      || { echo "$build/bin/$t does not run" >&2; exit 1; }
    echo "$t=$build/bin/$t"
  done
  echo "llama-cpp-python=$version"
  echo "llama.cpp-commit=$commit"
  echo "flags=$flags"
} >"$ready.tmp"
mv "$ready.tmp" "$ready"
cat "$ready"
