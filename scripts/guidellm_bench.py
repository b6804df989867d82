"""guidellm (vLLM's load tool, written by nobody here) against `verispec serve`,
for a bounded time, speculation on against --proposer none.

    python scripts/guidellm_bench.py [--seconds 60] [--streams 1,4] [--out docs/results/guidellm]

guidellm lives in its own virtual environment (.venv/guidellm, made on first
use with --system-site-packages, so it sees this machine's torch and
transformers and installs nothing over them): installed next to verispec it
would downgrade click and multidict, which ray and uvicorn use. It reads the
default model's tokenizer from the local folder verispec converted
(verispec.models.loading), never from the hub, and sends synthetic prompts of
fixed token counts (guidellm's synthetic_text), so nothing is downloaded.

For each server configuration (each a fresh `verispec serve` on the default
model), guidellm runs a concurrent profile at every --streams value, each for
--seconds, over /v1/chat/completions streamed, and writes its JSON report. The
script prints one Markdown table of the reports' medians (request latency,
time to first token, inter-token latency, output tokens/s) and leaves
guidellm's own JSON and console reports in --out.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "guidellm"
GUIDELLM = "guidellm==0.8.1"
SERVERS = {"speculative (auto, the default)": [], "plain (--proposer none)": ["--proposer", "none"]}


def ensure_guidellm() -> Path:
    """The venv's guidellm executable, installed on first use."""
    exe = VENV / "bin" / "guidellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)],
                       check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", GUIDELLM], check=True)
    return exe


def local_tokenizer() -> str:
    """The default model's tokenizer folder (tokenizer.json, chat template), converted
    from the GGUF by verispec's own loading code: no hub."""
    from verispec.models.loading import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path(), quiet=True)
    folder = Path(tokenizer.name_or_path)
    if not (folder / "tokenizer.json").is_file():
        raise SystemExit(f"no local tokenizer folder at {folder}")
    return str(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str], port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--host", "127.0.0.1",
           "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(1)
    stop_server(proc)
    raise SystemExit("server did not come up in 300 s")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def guidellm_command(exe: Path, port: int, model: str, tokenizer: str, args, path: Path) -> list[str]:
    return [str(exe), "run",
            "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},model={model},"
                         f"request_format=/v1/chat/completions",
            "--profile", "kind=concurrent", "--override", "profile.streams", args.streams,
            "--constraint", f"kind=max_duration,seconds={args.seconds}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                      f"output_tokens={args.output_tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--seed", "kind=static,value=42",
            "--output", f"kind=json,path={path}",
            "--disable-progress"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="per concurrency level")
    parser.add_argument("--streams", default="1,4", help="concurrent streams, comma list")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "guidellm"))
    args = parser.parse_args()
    exe = ensure_guidellm()
    tokenizer = local_tokenizer()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = []
    for label, extra in SERVERS.items():
        port = free_port()
        server = start_server(extra, port)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models") as r:
                model = json.load(r)["data"][0]["id"]
            slug = "speculative" if not extra else "plain"
            cmd = guidellm_command(exe, port, model, tokenizer, args, out / f"{slug}.json")
            commands.append((label, extra, cmd))
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            with open(out / f"{slug}.console.txt", "w", encoding="utf-8") as log:
                subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
        finally:
            stop_server(server)
    print(f"guidellm {GUIDELLM.split('==')[1]}, {args.seconds:g} s per level, synthetic "
          f"{args.prompt_tokens}-token prompts, {args.output_tokens} output tokens\n")
    print(summary_table(out))
    for label, extra, cmd in commands:
        print(f"\n{label}: verispec serve {shlex.join(extra)}\n  {shlex.join(cmd)}")


def summary_table(out: Path) -> str:
    from guidellm_report import rows  # reads guidellm's JSON without importing guidellm

    lines = ["| server | streams | requests | request latency median s | TTFT median ms "
             "| ITL median ms | output tok/s (server, mean) |", "|---|---|---|---|---|---|---|"]
    for slug in ("speculative", "plain"):
        path = out / f"{slug}.json"
        if path.is_file():
            lines += [f"| {slug} | " + " | ".join(cells) + " |" for cells in rows(path)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
