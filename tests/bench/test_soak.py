"""scripts/soak.py, the soak benchmark, run for a few seconds against a server on a
tiny random model with the default tokenizer (so grammars and tools run), so the
script cannot rot: every template is sent, every reply is checked against its solo
run, a burst past the queue is answered 429, hung-up streams are counted, the idle end is
read after the server settles, and the report and plot are written with the goals."""
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
from soak_report import goals, markdown, per_minute  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine_default_tokenizer(tmp_path_factory.mktemp("tiny-49k-soak"), seed=7,
                                           max_positions=2048)
    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=4, adaptive=True),
                          SchedulerConfig(max_num_seqs=2, max_queue=3))
    with ServerThread(create_app(engine, config)) as srv:
        yield srv


def test_a_short_soak_passes_its_goals(server, tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "SETTLE_SECONDS", 1.0)
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
    # the idle end: read a settle after every client finished and the gauges first read 0
    drained, final = result["drained"], result["final"]
    assert not any(drained["gauges"].values()) and not any(final["gauges"].values())
    assert final["at"] - drained["at"] >= 1.0 and final["rss_mb"]
    assert result["settling"] and all(drained["at"] < s["at"] <= final["at"]
                                      for s in result["settling"])
    report = soak.write_report(result, tmp_path)
    assert "| zero 5xx | PASS |" in report and "smoke test" in report
    assert "read 1 s after every client had finished and the gauges first read 0" in report
    assert (tmp_path / "soak.png").stat().st_size > 1000
    json.dumps(result)


def _minutes_of_rss(rss_by_minute: list[float], end_rss: float,
                    drained_rss: float | None = None) -> dict:
    """A run's records for the RSS goal alone: one sample every 2 s at each minute's RSS,
    then the drained sample at the traffic's end (when `drained_rss` is given) and the idle
    end five seconds later."""
    gauges = dict.fromkeys(soak.GAUGES, 0.0)
    samples = [{"at": 60 * m + s, "rss_mb": rss, "gauges": gauges, "load": 1.0}
               for m, rss in enumerate(rss_by_minute) for s in range(0, 60, 2)]
    end = 60 * len(rss_by_minute)
    final = {"at": end + 5, "rss_mb": end_rss, "gauges": gauges, "load": 1.0}
    result = {"records": [], "samples": samples, "final": final, "traffic_seconds": end + 1,
              "templates": [], "settings": {"minutes": len(rss_by_minute), "clients": 1,
                                            "burst": 1, "burst_every": 90, "hang_up": 0.1,
                                            "max_num_seqs": 8, "max_queue": 16}}
    if drained_rss is None:
        result["samples"].append(final)
    else:
        drained = {"at": end + 0.1, "rss_mb": drained_rss, "gauges": gauges, "load": 1.0}
        result.update(drained=drained, settle_seconds=4.9, settling=[])
        result["samples"].append(drained)
    return result


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


def test_the_idle_end_is_the_settled_sample_and_the_drained_one_is_reported_beside_it():
    """A request's last buffers can still be mapped at the instant the gauges read 0: the
    goal reads the idle end after the settle, and the report names both readings."""
    result = _minutes_of_rss([500, 700, 700, 730, 700, 700], 690, drained_rss=766)
    rows = per_minute(result)
    checked = goals(result, rows)
    assert checked["RSS flat within 5% after warm-up"] is True
    assert (checked["_end_rss"], checked["_drained_rss"]) == (690, 766)
    text = markdown(result, rows, checked)
    assert "idle at the end: 690 MiB, read 4.9 s after every client had finished" in text
    assert "(the drained sample, not used for the goal): 766 MiB" in text
    grew = _minutes_of_rss([500, 700, 700, 730, 700, 700], 731, drained_rss=690)
    assert goals(grew, per_minute(grew))["RSS flat within 5% after warm-up"] is False


def test_a_run_recorded_before_the_settle_is_judged_by_its_drained_end_and_says_so():
    result = _minutes_of_rss([500, 700, 700, 730, 700, 700], 740)
    rows = per_minute(result)
    checked = goals(result, rows)
    assert checked["RSS flat within 5% after warm-up"] is False
    assert "idle at the end: 740 MiB, read as soon as the gauges read 0" in markdown(
        result, rows, checked)


def test_the_soak_client_drops_idle_connections_before_the_server_closes_them():
    """Else a request can go out on a connection the server is closing (a reset, counted
    as a lost reply that the server never received)."""
    from verispec.serving.background import KEEP_ALIVE_SECONDS

    assert soak.KEEPALIVE_EXPIRY < KEEP_ALIVE_SECONDS
