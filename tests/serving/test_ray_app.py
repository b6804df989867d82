"""verispec's Ray Serve application without a long-lived cluster: prefix
affinity, merged metrics, the app's options and example config, and the CLI
(`serve --ray`) leaving no Ray process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest
from ray_support import PREFIX, REPO, free_port, get, small_model_dir, wait_gone

from verispec.serving.ray_app import build_app
from verispec.serving.ray_router import affinity_key


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return small_model_dir(tmp_path_factory)


def test_affinity_key():
    long = "x" * PREFIX
    assert affinity_key(json.dumps({"prompt": long + "a"}).encode(), False, PREFIX) == long
    assert affinity_key(json.dumps({"prompt": [long + "b", "c"]}).encode(), False, PREFIX) == long
    assert affinity_key(json.dumps({"prompt": "short"}).encode(), False, PREFIX) is None
    chat = {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "q"}]}
    key = affinity_key(json.dumps(chat).encode(), True, PREFIX)
    chat["messages"][1]["content"] = "another question"
    assert key is not None and key == affinity_key(json.dumps(chat).encode(), True, PREFIX)
    assert affinity_key(b"{not json", False, PREFIX) is None
    assert affinity_key(b"[1]", True, PREFIX) is None


def test_metrics_states_merge_to_the_sum():
    from verispec.serving.metrics import Gauges, ServingMetrics

    a, b, both = ServingMetrics(), ServingMetrics(), ServingMetrics()
    for m in (a, both):
        m.admitted(5)
        m.step(2, 0.01, [3, 0], 4, 3, 2)
        m.request_done("finished", tau=1.5)
    for m in (b, both):
        m.admitted(7)
        m.step(1, 0.2, [1], 2, 1, 1)
        m.request_done("cancelled")
    merged = ServingMetrics.merged([json.loads(json.dumps(a.state())), b.state()])
    gauges = Gauges(1, 2, 3)
    assert merged.render(gauges).replace("verispec_batch_size 3", "verispec_batch_size 1") == \
        both.render(gauges)  # last_batch_size sums over replicas: 2 + 1, against 1 for one


def test_build_app_options():
    app = build_app({"replicas": "1:4", "replica_cpus": 2, "replica_gpus": 1, "max_num_seqs": 6})
    replica = app._bound_deployment.init_args[0]._bound_deployment
    scaling = replica._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests) == (1, 4, 6)
    assert replica.ray_actor_options == {"num_cpus": 2.0, "num_gpus": 1.0, "runtime_env": {
        "env_vars": {"MALLOC_ARENA_MAX": "1"}}}
    assert replica.max_ongoing_requests == 12
    with pytest.raises(ValueError, match="replicas"):
        build_app({"replicas": "4:1"})
    with pytest.raises(ValueError, match="proposer"):
        build_app({"proposer": "magic"})
    with pytest.raises(ValueError):
        build_app({"max_num_seqs": 8, "bogus_setting": 1})


def test_example_config_builds():
    """examples/ray_serve.yaml is what `serve run` / `serve deploy` read: the schema
    accepts it and its import path and args build the application."""
    import yaml
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(
        yaml.safe_load((REPO / "examples" / "ray_serve.yaml").read_text()))
    (entry,) = config.applications
    app = call_user_app_builder_with_args_if_necessary(import_attr(entry.import_path), entry.args)
    assert app._bound_deployment.name == "VerispecIngress"
    assert {d.name for d in entry.deployments} == {"VerispecReplica", "VerispecIngress"}
    # Serve takes a deployment's ray_actor_options from the config whole, not merged with
    # the app's: the replica's one malloc arena must be there too.
    replica = next(d for d in entry.deployments if d.name == "VerispecReplica")
    assert replica.ray_actor_options.runtime_env["env_vars"]["MALLOC_ARENA_MAX"] == "1"


@pytest.fixture
def ray_cli(model_dir, tmp_path):
    """`verispec serve --ray` in its own process, up and healthy: (process, port)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", "serve", "--ray", "--replicas", "1",
         "--model", str(model_dir), "--dtype", "fp32", "--backend", "hf", "--port", str(port),
         "--proposer", "ngram", "--log-level", "warning"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray app did not come up in 180 s"
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_cli_serves_and_shutdown_leaves_no_ray_process(model_dir, ray_cli):
    proc, port = ray_cli
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    got = client.completions.create(model=str(model_dir), prompt="one two one two",
                                    max_tokens=5, temperature=0)
    assert got.usage.completion_tokens == 5
    started = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert len(started) >= 4  # gcs, raylet, the Serve controller, proxy, replicas...
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0
    left = wait_gone(started, 30)
    assert not left, [psutil.Process(p).cmdline()[:3] for p in left if psutil.pid_exists(p)]
