"""llama.cpp's own server as a bench peer: `llama-server` started as a subprocess on
loopback and timed through its HTTP API (`/completion` with token ids), as users run it.

  llamaserver-plain          greedy decoding
  llamaserver-ngram-mod      --spec-type ngram-mod: one hashed n-gram pool for all requests
  llamaserver-ngram-simple   --spec-type ngram-simple: the last n-gram looked up in the context
  llamaserver-ngram-map-k    --spec-type ngram-map-k (and -ngram-map-k4v): n-gram maps
  llamaserver-ngram-cache    --spec-type ngram-cache: lookup decoding's n-gram caches
  llamaserver-draft          --spec-type draft-simple with --draft PATH, a GGUF that shares
                             the target's vocabulary

Every server gets verispec's thread count (-t N -tb N), one slot, a context that fits the
run, no prompt cache (cache_prompt false, --cache-ram 0) and greedy sampling with its other
samplers off. Draft lengths are llama-server's own defaults. The speculative types keep
state across requests (ngram-mod's pool, ngram-cache's caches), so each speculative request
runs on a freshly started server: a repeat must not draft from the previous repeat's output.
llama-server has no self-style draft (the target's own first layers); a draft is a second
model file.

The binary: $VERISPEC_LLAMA_SERVER, else the READY file that scripts/build_llama_cpp.sh
writes in $VERISPEC_LLAMA_CPP_DIR (default ~/.cache/verispec/llama.cpp), else PATH.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.bench.runner import PeerOutput
from verispec.config import SamplingParams
from verispec.step.lossless import Comparison, first_divergence

SERVER_ENV = "VERISPEC_LLAMA_SERVER"
DIR_ENV = "VERISPEC_LLAMA_CPP_DIR"
DEFAULT_DIR = Path("~/.cache/verispec/llama.cpp")
BUILD_HINT = ("build it once with scripts/build_llama_cpp.sh (llama.cpp from the llama-cpp-python "
              f"sdist on PyPI; then set {DIR_ENV} to its --dir), or set {SERVER_ENV} to a "
              "llama-server binary")
PLAIN = "llamaserver-plain"
DRAFT = "llamaserver-draft"
DRAFTLESS = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
SERVER_PEERS: dict[str, str] = {
    PLAIN: "llama-server (llama.cpp's own server, over HTTP) greedy decoding on the GGUF",
    **{f"llamaserver-{t}": f"llama-server --spec-type {t}" for t in DRAFTLESS},
    DRAFT: "llama-server --spec-type draft-simple with --draft PATH.gguf",
}
_START_TIMEOUT_S = 600.0  # an 8B file's first load from a cold disk
# The bf16 margin of verispec.step.lossless, so that "tie" means the same in every
# row of the table. llama.cpp's batched path (prefill, verification) and its
# one-token path differ by more than this: up to 0.4 on the chosen token's logit
# on the default model, so some divergences it calls "diff" are numerics.
NEAR_TIE = 0.1
_MIN_CONTEXT = 1024


def context_bucket(n: int) -> int:
    # Power-of-two context sizes: a longer prompt later restarts the server at most a
    # few times, and never inside a timed call.
    size = _MIN_CONTEXT
    while size < n:
        size *= 2
    return size


def gguf_path(model: str | None) -> Path:
    """The GGUF file llama.cpp reads for the model verispec was asked to load."""
    from verispec.models.loading import DEFAULT_MODEL, default_gguf_path

    if model in (None, DEFAULT_MODEL):
        return default_gguf_path()
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(f"they need a .gguf model and {model} is not one")
    return path


def ready_file() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser() / "READY"


def read_ready(path: Path | None = None) -> dict[str, str]:
    """`name=value` lines of the build's READY file; empty when there is none."""
    path = path or ready_file()
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def find_tool(name: str = "llama-server") -> Path | None:
    """A llama.cpp tool (llama-server, llama-bench, llama-quantize): the environment's
    override for the server, else the READY file, else PATH; None when none exists."""
    override = os.environ.get(SERVER_ENV) if name == "llama-server" else None
    candidates = [override, read_ready().get(name), shutil.which(name)]
    return next((Path(c) for c in candidates if c and os.access(c, os.X_OK)), None)


def missing_reason() -> str | None:
    """Why llama-server cannot run here, or None."""
    if os.environ.get(SERVER_ENV) and find_tool() is None:
        return f"{SERVER_ENV}={os.environ[SERVER_ENV]} is not an executable; {BUILD_HINT}"
    return None if find_tool() else f"no llama-server binary found; {BUILD_HINT}"


def exit_text(code: int) -> str:
    """A llama.cpp tool's exit status in words: a negative code is the signal that killed
    it, and SIGILL says which build to make instead."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    text = f"exited with code {code} ({name})"
    if -code == signal.SIGILL:
        text += (": this build uses an instruction that faults on this CPU; on an AMX Xeon "
                 "that is llama.cpp's AMX kernels: scripts/build_llama_cpp.sh --flags avx512 "
                 "builds without them")
    return text


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LlamaServer:
    """One llama-server process on a free loopback port; its log goes to a temporary file
    that a failure quotes."""

    def __init__(self, binary: Path, args: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.url = f"http://127.0.0.1:{_free_port()}"
        env = dict(os.environ)
        # A passive OpenMP wait makes llama.cpp's threads sleep between graph nodes, several
        # times slower (docs/notebook/quantized.md); the bench's own setting is not the server's.
        env.pop("OMP_WAIT_POLICY", None)
        command = [str(binary), *args, "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1]]
        try:
            self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            self._drop_log()
            raise ValueError(f"cannot start llama-server {binary}: {exc.strerror}; "
                             f"{BUILD_HINT}") from None
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        self._wait_healthy()

    def _drop_log(self) -> None:
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def _tail(self, lines: int = 15) -> str:
        text = Path(self.log.name).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self._tail()
                self.close()
                raise ValueError(f"llama-server {exit_text(self.proc.returncode)} "
                                 f"while loading:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.1)
        tail = self._tail()
        self.close()
        raise ValueError(f"llama-server did not come up in {_START_TIMEOUT_S:.0f} s:\n{tail}")

    def cpu_seconds(self) -> float:
        """User plus system time of the server's threads so far (/proc, in clock ticks)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=3600) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ValueError(f"llama-server {path}: HTTP {exc.code}: "
                             f"{exc.read().decode(errors='replace')[:500]}") from None
        except (urllib.error.URLError, ConnectionError) as exc:
            state = (f"it has {exit_text(self.proc.returncode)}"
                     if self.proc.poll() is not None else "it is still running")
            raise ValueError(f"llama-server {path}: no answer ({exc}); {state}:\n"
                             f"{self._tail()}") from None

    def close(self) -> None:
        self._finalizer()
        self._drop_log()


@dataclass(frozen=True)
class ServerRun:
    """One /completion answer: the token ids and the server's own timings."""
    token_ids: list[int]
    finish_reason: str
    seconds: float  # wall time of the request, from here
    cpu_seconds: float  # the server's CPU time over the request
    prefill_seconds: float
    decode_seconds: float
    drafted: int | None
    accepted: int | None
    top_logprobs: list[dict[int, float]]  # per generated token, when asked for


def completion_body(ids: list[int], sampling: SamplingParams, n_predict: int,
                    n_probs: int = 0) -> dict:
    """A /completion request on token ids with only the settings verispec's sampler has."""
    body = {"prompt": list(ids), "n_predict": n_predict, "cache_prompt": False,
            "return_tokens": True, "ignore_eos": sampling.ignore_eos, "n_probs": n_probs,
            "repeat_penalty": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
            "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0}
    if sampling.greedy:
        body["temperature"] = 0.0
    else:
        body.update(temperature=sampling.temperature, top_k=sampling.top_k or 0,
                    top_p=sampling.top_p)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def parse_completion(answer: dict, seconds: float, cpu_seconds: float) -> ServerRun:
    """A /completion answer (JSON) as a ServerRun: the generated ids, why it stopped (its
    `stop_type` "eos", or a length), the server's prefill and decode times, its draft
    counts when it speculated and the top log-probabilities when `n_probs` asked for them."""
    timings = answer.get("timings", {})
    probs = [{int(p["id"]): float(p["logprob"]) for p in step.get("top_logprobs", [])}
             for step in answer.get("completion_probabilities", [])]
    return ServerRun([int(t) for t in answer["tokens"]],
                     "stop" if answer.get("stop_type") == "eos" else "length", seconds,
                     cpu_seconds, timings.get("prompt_ms", 0.0) / 1e3,
                     timings.get("predicted_ms", 0.0) / 1e3, timings.get("draft_n"),
                     timings.get("draft_n_accepted"), probs)


def complete(server: LlamaServer, body: dict) -> ServerRun:
    cpu = server.cpu_seconds()
    start = time.perf_counter()
    answer = server.post("/completion", body)
    seconds = time.perf_counter() - start
    return parse_completion(answer, seconds, server.cpu_seconds() - cpu)


def server_args(gguf: Path, peer: str, threads: int, n_ctx: int,
                draft: Path | None = None) -> list[str]:
    """The command line of `peer`'s server, less the address."""
    args = ["-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx),
            "-np", "1", "--cache-ram", "0", "--no-webui"]
    if peer == DRAFT:
        if draft is None:
            raise ValueError(f"{DRAFT} needs a draft model: give --draft PATH.gguf")
        args += ["--spec-type", "draft-simple", "-md", str(draft),
                 "-td", str(threads), "-tbd", str(threads)]
    elif peer != PLAIN:
        args += ["--spec-type", peer.removeprefix("llamaserver-")]
    return args


class LlamaServerPeers:
    """Runs the llama-server peers on one GGUF file, one server process per peer."""

    def __init__(self, gguf: Path, target, threads: int | None = None,
                 draft: str | None = None, binary: Path | None = None) -> None:
        from verispec.models.gguf_file import GGUFFile

        reason = None if binary else missing_reason()
        if reason:
            raise ValueError(reason)
        self.binary = binary or find_tool()
        self.gguf = Path(gguf)
        self.threads = threads or torch.get_num_threads()
        self.draft = Path(draft) if draft and str(draft).endswith(".gguf") else None
        vocab = GGUFFile(self.gguf).metadata["tokenizer.ggml.tokens"].count
        if vocab != target.vocab_size:
            raise ValueError(f"{self.gguf.name} has {vocab} tokens and the target "
                             f"{target.vocab_size}: the token ids would not mean the same")
        self._servers: dict[str, tuple[int, LlamaServer]] = {}
        self._used: set[str] = set()

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True)
        return (out.stdout + out.stderr).strip().splitlines()[0] if out.returncode == 0 else "?"

    def server(self, peer: str, needed: int, fresh: bool = False) -> LlamaServer:
        """`peer`'s server with a context of at least `needed` tokens, restarted when it is
        too small or when `fresh` is asked of a server that has served a request."""
        if peer not in SERVER_PEERS:
            raise ValueError(f"unknown llama-server peer {peer!r}")
        held = self._servers.get(peer)
        if held is not None and held[0] >= needed and not (fresh and peer in self._used):
            return held[1]
        if held is not None:
            held[1].close()  # its memory goes before the next one loads
            del self._servers[peer]
        n_ctx = context_bucket(needed)
        server = LlamaServer(self.binary, server_args(self.gguf, peer, self.threads, n_ctx,
                                                      self.draft))
        self._servers[peer] = (n_ctx, server)
        self._used.discard(peer)
        return server

    def run(self, config, ids: list[int], sampling: SamplingParams) -> PeerOutput:
        n = sampling.max_new_tokens
        server = self.server(config.peer, len(ids) + n + 1, fresh=config.peer != PLAIN)
        self._used.add(config.peer)
        out = complete(server, completion_body(ids, sampling, n))
        return PeerOutput(out.token_ids, out.seconds, out.finish_reason,
                          prefill_seconds=out.prefill_seconds, decode_seconds=out.decode_seconds,
                          drafted=out.drafted, accepted=out.accepted, cpu_seconds=out.cpu_seconds)

    def compare(self, prompt: list[int], plain: list[int], other: list[int]) -> Comparison:
        """`verispec.step.lossless.compare_greedy` in llama-server's own numerics: the plain
        request is replayed up to the divergence with the top log-probabilities of each
        step (a log-probability gap is the logit gap), along the path it took."""
        n = min(len(plain), len(other))
        i = first_divergence(plain[:n], other[:n])
        if i is None:
            return Comparison(identical=True)
        greedy = SamplingParams(max_new_tokens=i + 1, ignore_eos=True)
        server = self.server(PLAIN, len(prompt) + i + 2)
        replay = complete(server, completion_body(prompt, greedy, i + 1, n_probs=20))
        if replay.token_ids[:i] != plain[:i]:
            raise ValueError("llamaserver-plain did not repeat its own output: "
                             "its greedy decoding is not deterministic here")
        logprobs = replay.top_logprobs[i]
        ranked = sorted(logprobs.values(), reverse=True)
        gap = ranked[0] - ranked[1]
        near = gap <= NEAR_TIE and ranked[0] - logprobs.get(other[i], float("-inf")) <= NEAR_TIE
        return Comparison(False, i, plain[i], other[i], gap, near)

    def close(self) -> None:
        for _, server in self._servers.values():
            server.close()
        self._servers.clear()
