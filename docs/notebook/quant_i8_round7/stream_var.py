# Build first: gcc -O2 -mavx512f -shared -fPIC -pthread -o stream_var.so stream_var.c
import ctypes, time, statistics as st, sys, mmap, os
lib = ctypes.CDLL(__import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "stream_var.so")); lib.stream.restype = ctypes.c_uint64
nbytes = 1 << 30
buf = mmap.mmap(-1, nbytes + (2 << 20)); addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
base = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
libc = ctypes.CDLL("libc.so.6"); libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(nbytes), 14)  # MADV_HUGEPAGE
ctypes.memset(base, 1, nbytes)
variants = [("T0 16K", 1, 16384), ("NTA 16K", 2, 16384), ("NTA 8K", 2, 8192), ("NTA 32K", 2, 32768), ("T0 8K", 1, 8192)]
for threads in (1, 2):
    res = {v[0]: [] for v in variants}
    for rep in range(15):
        for name, mode, dist in variants:
            t = time.perf_counter(); lib.stream(ctypes.c_void_p(base), ctypes.c_size_t(nbytes), threads, mode, dist); res[name].append(time.perf_counter() - t)
    print(f"threads {threads}: " + ", ".join(f"{n} {nbytes/st.median(v)/1e9:.1f}" for n, v in res.items()) + " GB/s")
