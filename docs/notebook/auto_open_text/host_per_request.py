# Ran at commit 4626ba5 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""The serving scheduler's measured host work per decoding request (cost.allocate's H) and
its step-cost table, after each of three waves of 16 adaptive suffix requests on `chat`
prompts (64 new tokens, default model, one scheduler in this process).

    OMP_NUM_THREADS=1 python docs/notebook/auto_open_text/host_per_request.py
"""
import threading

from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
from verispec.serving.scheduler import Progress, Scheduler, SchedulerConfig, Ticket

engine = Engine("default")
prompts = [engine.encode_messages(list(p.messages)) for p in load_workload("chat", 24)]
scheduler = Scheduler(engine.target, engine.new_request, SchedulerConfig(max_num_seqs=16))


class Sink:
    def __init__(self) -> None:
        self.done = threading.Event()

    def __call__(self, event) -> None:
        if not isinstance(event, Progress) or event.finish_reason:
            self.done.set()


spec = SpecConfig("suffix", k=4, adaptive=True)
for wave in range(3):
    batch = (prompts[wave * 8:] + prompts)[:16]
    sinks = [Sink() for _ in batch]
    scheduler.submit([Ticket(ids, SamplingParams(max_new_tokens=64), spec, sink)
                      for ids, sink in zip(batch, sinks)])
    for sink in sinks:
        sink.done.wait(120)
    table = scheduler.cost.table(81)
    print(f"wave {wave}: H per request {1e3 * (scheduler._host.measured or 0.0):.3f} ms; "
          "T(1), T(16), T(17), T(32), T(80) ms:",
          [round(float(table[w]) * 1e3, 2) for w in (1, 16, 17, 32, 80)])
scheduler.close()
