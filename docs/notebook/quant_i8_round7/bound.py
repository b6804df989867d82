"""bound.py MODEL THREADS PAIRS: one process alternates a 1-row forward with a read of the
same packed weights at the same thread count (pthreads, 16 KiB prefetch): forward / stream."""
import sys, os, time, gc, ctypes, torch, statistics as st
from verispec.models.loading import load_target
model, threads, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
packs = [t for args in target._fused_args for t in args if t.dtype == torch.uint8 and t.numel() > 1 << 16]
head = target.weights.lm_head.weight
if head.dtype == torch.uint8: packs.append(head)
nbytes = sum(t.numel() for t in packs)
lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_mt.so"))
Arr = ctypes.c_void_p * len(packs); Siz = ctypes.c_size_t * len(packs)
bufs, sizes = Arr(*[t.data_ptr() for t in packs]), Siz(*[t.numel() for t in packs])
lib.stream.restype = ctypes.c_uint64
ctx = 200
cache = target.new_cache(ctx + 16)
toks = list(range(1000, 1000 + ctx + 16))
gc.collect(); gc.freeze()
fw, sw, ratios = [], [], []
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    x = torch.tensor(toks[ctx:ctx + 1])
    for p in range(pairs):
        f = []
        for i in range(4):
            t = time.perf_counter(); target.forward(x, cache); f.append(time.perf_counter() - t); cache.truncate(ctx)
        time.sleep(0.01)  # let torch's pool go idle before the pthreads read
        s = []
        for i in range(4):
            t = time.perf_counter(); lib.stream(bufs, sizes, len(packs), threads); s.append(time.perf_counter() - t)
        fw += f; sw += s; ratios.append(st.median(f) / st.median(s))
print(f"{os.path.basename(model)} t={threads}: {nbytes/2**20:.0f} MiB packed; forward {1e3*st.median(fw):.2f} ms, stream {1e3*st.median(sw):.2f} ms ({nbytes/st.median(sw)/1e9:.1f} GB/s); forward/stream paired median {st.median(ratios):.3f} (q1 {sorted(ratios)[len(ratios)//4]:.3f} q3 {sorted(ratios)[3*len(ratios)//4]:.3f})")
