"""split.py MODEL THREADS PAIRS: in one process, alternate (a) a 1-row forward, (b) the same
token's matmuls alone (every layer's 4 packs and the head through kernels.linear, in layer
order), (c) a read of the same bytes. Paired medians of a/c and b/c.
Build stream_mt.so beside it first: gcc -O2 -mavx512f -shared -fPIC -pthread -o stream_mt.so stream_mt.c"""
import sys, os, time, gc, ctypes, torch, statistics as st
from verispec import kernels
from verispec.models.loading import load_target
model, threads, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
packs = [args[i] for args in target._fused_args for i in (1, 4, 6, 7)]
head = target.weights.lm_head
packs.append(head.weight)
shapes = [tuple(kernels.quant_shape(p)) for p in packs]
xs = [torch.randn(1, s[1]).to(torch.bfloat16) for s in shapes]
lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_mt.so"))
lib.stream.restype = ctypes.c_uint64
Arr = ctypes.c_void_p * len(packs); Siz = ctypes.c_size_t * len(packs)
bufs, sizes = Arr(*[t.data_ptr() for t in packs]), Siz(*[t.numel() for t in packs])
cache = target.new_cache(230); toks = list(range(1000, 1230))
gc.collect(); gc.freeze()
res = {"fwd": [], "mm": [], "str": []}; ra, rb = [], []
def timed(fn, n=3):
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return st.median(out)
with torch.inference_mode():
    target.forward(torch.tensor(toks[:200]), cache, num_logits=1)
    x = torch.tensor(toks[200:201])
    def fwd():
        target.forward(x, cache); cache.truncate(200)
    def mm():
        for pk, s, xx in zip(packs, shapes, xs): kernels.linear(xx, pk, s[0], None)
    def stream():
        lib.stream(bufs, sizes, len(packs), threads)
    for p in range(pairs):
        f = timed(fwd); m = timed(mm); time.sleep(0.01); s = timed(stream)
        res["fwd"].append(f); res["mm"].append(m); res["str"].append(s); ra.append(f / s); rb.append(m / s)
q = lambda v: f"{st.median(v):.3f} [{sorted(v)[len(v)//4]:.3f}, {sorted(v)[3*len(v)//4]:.3f}]"
print(f"{os.path.basename(model)} t={threads}: fwd {1e3*st.median(res['fwd']):.2f} mm {1e3*st.median(res['mm']):.2f} stream {1e3*st.median(res['str']):.2f} ms | fwd/stream {q(ra)} mm/stream {q(rb)}")
