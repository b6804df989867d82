"""Full GC collections in a serving process under load: count and duration (gc.callbacks)."""
import gc, sys, time, threading, concurrent.futures as cf
sys.path.insert(0, '.')
import httpx
from verispec.api import Engine
from verispec.serving.server import ServerConfig, create_app
from verispec.serving.background import ServerThread
freeze = len(sys.argv) > 1 and sys.argv[1] == "freeze"
engine = Engine("default")
app = create_app(engine, ServerConfig(("default",)))
if freeze:
    gc.collect(); gc.freeze()
events, start = [], {}
def cb(phase, info):
    if phase == "start": start['t'] = time.perf_counter()
    else: events.append((info['generation'], 1e3 * (time.perf_counter() - start['t'])))
gc.callbacks.append(cb)
prompts = ["Write a story about a dragon.", "Explain how a CPU cache works.", "Write a python function for fib.", "List ten fruits."]
def one(i):
    body = {"model": "default", "messages": [{"role": "user", "content": prompts[i % 4]}], "max_tokens": 64,
            "stream": i % 2 == 0, "temperature": 0 if i % 3 else 0.8}
    with httpx.Client(timeout=120) as c:
        r = c.post(url + "/v1/chat/completions", json=body)
        return r.status_code
with ServerThread(app) as server:
    url = server.url
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(one, range(96)))
    wall = time.perf_counter() - t0
full = [ms for g, ms in events if g == 2]
print(f"freeze={freeze}: {len(codes)} requests ({set(codes)}), {wall:.0f} s; collections {len(events)}, "
      f"gen2 {len(full)}: {', '.join(f'{x:.0f}' for x in full)} ms; gen0/1 total {sum(ms for g, ms in events if g < 2):.0f} ms")
