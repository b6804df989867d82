"""scripts/soak.py, the soak benchmark, run for a few seconds against a server on a
tiny random model with the default tokenizer (so grammars and tools run), so the
script cannot rot: every template is sent, every reply is checked against its solo
run, a burst past the queue is answered 429, hung-up streams are counted, and the
report and plot are written with the goals."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import tiny_engine_default_tokenizer

from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import soak  # noqa: E402
from soak_report import goals, per_minute  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine_default_tokenizer(tmp_path_factory.mktemp("tiny-49k-soak"), seed=7,
                                           max_positions=2048)
    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=4, adaptive=True),
                          SchedulerConfig(max_num_seqs=2, max_queue=3))
    with ServerThread(create_app(engine, config)) as srv:
        yield srv


def test_a_short_soak_passes_its_goals(server, tmp_path):
    args = soak.parser().parse_args([
        "--url", server.url, "--pid", str(os.getpid()), "--out", str(tmp_path),
        "--minutes", "0.15", "--clients", "3", "--burst", "10", "--burst-every", "3",
        "--hang-up", "0.5", "--max-num-seqs", "2", "--max-queue", "3", "--timeout", "120",
        "--max-tokens", "12",
        "--note", "smoke test"])
    result = asyncio.run(soak.run(args))
    outcomes = {r["outcome"] for r in result["records"]}
    checked = goals(result, per_minute(result))
    bad = [r for r in result["records"] if r["outcome"] not in ("ok", "rejected", "disconnected")]
    assert not bad, bad[:5]
    assert checked["zero 5xx"] and checked["zero lost or mixed-up replies"]
    assert checked["every reply valid"] and checked["gauges back to 0 at the end"], checked
    assert {"ok", "rejected"} <= outcomes  # a burst past batch + queue gets 429s
    assert len(result["records"]) >= 10
    assert all(s["rss_mb"] and s["load"] is not None for s in result["samples"])
    report = soak.write_report(result, tmp_path)
    assert "| zero 5xx | PASS |" in report and "smoke test" in report
    assert (tmp_path / "soak.png").stat().st_size > 1000
    json.dumps(result)


def _minutes_of_rss(rss_by_minute: list[float], end_rss: float) -> dict:
    """A run's records for the RSS goal alone: one sample every 2 s at each minute's RSS,
    then the idle end a few seconds after the traffic."""
    gauges = dict.fromkeys(soak.GAUGES, 0.0)
    samples = [{"at": 60 * m + s, "rss_mb": rss, "gauges": gauges, "load": 1.0}
               for m, rss in enumerate(rss_by_minute) for s in range(0, 60, 2)]
    final = {"at": 60 * len(rss_by_minute) + 5, "rss_mb": end_rss, "gauges": gauges, "load": 1.0}
    return {"records": [], "samples": samples + [final], "final": final,
            "traffic_seconds": 60 * len(rss_by_minute) + 1}


@pytest.mark.parametrize("rss_by_minute, end_rss, flat", [
    ([500, 700, 700, 730, 700, 700], 650, True),  # a warm-up climb; the idle end lower
    ([500, 700, 700, 740, 700, 700], 650, False),  # 5.7% over the minutes after warm-up
    ([500, 700, 700, 730, 700, 700], 731, False),  # the end above every minute: it grew
])
def test_the_rss_goal_spans_whole_minutes_of_traffic_and_checks_the_idle_end(
        rss_by_minute, end_rss, flat):
    result = _minutes_of_rss(rss_by_minute, end_rss)
    checked = goals(result, per_minute(result))
    assert checked["RSS flat within 5% after warm-up"] is flat
    assert checked["_rss_minutes"] == (2, 6)
