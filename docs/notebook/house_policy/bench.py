"""`verispec bench` with switches for issue 42's A/Bs, set by environment variables
(each a patch of the checkout it runs in, at commit 3697828 or the policy branch):

- GUARD=0: serving's realized-rate guard off (SchedulerConfig.guard_window = 0).
- AUTO_CANDIDATES=ngram,suffix,lookahead: `auto`'s candidate list (the heads out).
- AUTO_RESTS=0: `auto`'s costly candidates never rest (AutoMemory.judge does nothing).
- SERVE_MODES=ngram,auto: the serving bench's modes are none, each of these proposers
  with k = auto, and none again (the A/A control), all on one server.

    OMP_NUM_THREADS=1 GUARD=0 python docs/notebook/house_policy/bench.py bench ...
"""
import functools
import os
import sys

from verispec.cli import main

if os.environ.get("GUARD") == "0":
    from verispec.serving import scheduler

    scheduler.SchedulerConfig = functools.partial(scheduler.SchedulerConfig, guard_window=0)
if os.environ.get("AUTO_CANDIDATES"):
    from verispec.proposers import auto

    auto.CANDIDATES = tuple(os.environ["AUTO_CANDIDATES"].split(","))
if os.environ.get("AUTO_RESTS") == "0":
    from verispec.proposers import auto_memory

    auto_memory.AutoMemory.judge = lambda self, name, saved: None
if os.environ.get("SERVE_MODES"):
    from verispec.serving import bench_serving

    def modes(proposer, k, control=False):
        listed = [bench_serving.Mode("none", {"proposer": "none"})]
        listed += [bench_serving.Mode(f"{name} adaptive", {"proposer": name, "k": "auto"})
                   for name in os.environ["SERVE_MODES"].split(",")]
        return listed + [bench_serving.Mode(bench_serving.CONTROL, {"proposer": "none"})]

    bench_serving.modes = modes

sys.exit(main())
