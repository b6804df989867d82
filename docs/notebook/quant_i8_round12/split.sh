# Issue 40 round 12: where a 1-row and an 8-row forward of the default model go, by perf's
# self time after loading (-D skips the first DELAY ms, 5000 by default). Run from this folder;
# MODEL=path.gguf DELAY=20000 bash split.sh for another file.
for rows in 1 8; do
  perf record -q -D ${DELAY:-5000} -o /tmp/split$rows.data -F 4000 -- python3 loop.py $rows ${SECONDS_LOOP:-14} $MODEL 2>&1 | tail -1
  perf report -i /tmp/split$rows.data --no-children --sort symbol --stdio 2>/dev/null | grep % | python3 -c "
import re, sys
share = {}
for line in sys.stdin:
    m = re.match(r'\s*([\d.]+)%\s+\[.\]\s+(.*)', line)
    if m:
        s = m.group(2)
        k = 'matmul' if any(n in s for n in ('sweep', 'GroupRows', 'matmul_i8', 'q45k', 'q6k', 'k_group', 'Chunk<')) else 'attention' if 'attend' in s else 'rest'
        share[k] = share.get(k, 0) + float(m.group(1))
print('  shares of samples:', {k: round(v, 1) for k, v in sorted(share.items())})"
done
