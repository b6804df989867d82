#!/bin/bash
# One probed soak: docs/notebook/soak_rss/run.sh LABEL MINUTES [serve args...]
# The server runs under probe.py (OUT/LABEL/probe.jsonl), scripts/soak.py drives it
# (OUT/LABEL/soak.json, soak.md); both at nice ${NICE:-19}, without the CPU lock, and the
# report's note is ${NOTE:-probed run LABEL}; ${SOAK_ARGS} go to soak.py (e.g. "--burst-every 45").
# Environment variables (MALLOC_ARENA_MAX, PROBE_TRACEMALLOC, ...) reach the server.
set -euo pipefail
label=$1 minutes=$2
shift 2
out=${SOAK_RSS_OUT:-/work/scratch/soak_rss}/$label
port=${PORT:-8791}
niceness=${NICE:-19}
mkdir -p "$out"
nice -n "$niceness" python3 docs/notebook/soak_rss/probe.py "$out/probe.jsonl" -- serve --model default \
    --port "$port" --max-num-seqs 8 --max-queue 16 --log-level warning "$@" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server' EXIT
nice -n "$niceness" python3 scripts/soak.py --minutes "$minutes" --url "http://127.0.0.1:$port" \
    --pid "$server" --out "$out" ${SOAK_ARGS:-} --note "${NOTE:-probed run $label}" > "$out/soak.log" 2>&1
grep -E "RSS|outcomes" "$out/soak.md"
