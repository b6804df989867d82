import sys, gc, collections, time
sys.path.insert(0, '.')
import torch
n0 = len(gc.get_objects())
t = time.perf_counter(); gc.collect(); print(f"after import torch: {n0} objects, full collect {1e3*(time.perf_counter()-t):.1f} ms")
from verispec.api import Engine
n1 = len(gc.get_objects())
t = time.perf_counter(); gc.collect(); print(f"after import verispec.api: {n1}, full collect {1e3*(time.perf_counter()-t):.1f} ms")
e = Engine(sys.argv[1])
gc.collect()
objs = gc.get_objects()
print("after Engine:", len(objs))
c = collections.Counter(type(o).__name__ for o in objs)
print(c.most_common(15))
t = time.perf_counter(); gc.collect(); print(f"full collect {1e3*(time.perf_counter()-t):.1f} ms")
