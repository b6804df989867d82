"""`verispec serve`: flags, checked before the model loads, then the server."""
from __future__ import annotations

import argparse

from verispec.cli.args import (
    add_model_args,
    add_suffix_cache_arg,
    engine_from,
    load_suffix_cache,
    proposer_arg,
    save_suffix_cache,
)
from verispec.serving.protocol import serve_defaults

_EPILOG = """\
examples:
  verispec serve --model default --proposer auto --host 127.0.0.1 --port 8000
  verispec serve --proposer ngram --k auto --k-max 8 --max-num-seqs 16 --max-queue 128
  verispec serve --proposer draft --draft self:12 --profile profile.json
  verispec serve --ray --replicas 1:4 --replica-cpus 2   (Ray Serve; docs/ray_serve.md)

then any OpenAI client:
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'

open http://127.0.0.1:8000/playground to watch speculation token by token.

A request may override speculation with an extra field, e.g.
  "speculation": {"proposer": "ngram", "k": 4}   (k "auto" = chosen per step under load)
"""


def cmd_serve(args: argparse.Namespace) -> int:
    from verispec.policy.economics import load_profile
    from verispec.serving.malloc import fix_thresholds
    from verispec.serving.scheduler import SchedulerConfig
    from verispec.serving.server import ServerConfig, serve

    defaults = serve_defaults(args)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in [1, 65535], got {args.port}")
    if args.ray or args.ray_address:
        from verispec.serving.ray_app import serve_ray

        if args.suffix_cache or args.suffix_max_tokens:
            flag = "--suffix-cache" if args.suffix_cache else "--suffix-max-tokens"
            raise ValueError(f"{flag} needs one server process: with --ray every "
                             "replica keeps its own suffix store")

        return serve_ray(args)
    fix_thresholds()  # before the model loads: no saw-tooth of heap tops over a long run
    scheduler = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_queue=args.max_queue,
                                profile=load_profile(args.profile) if args.profile else None,
                                guard_window=args.guard_window)
    engine = engine_from(args)
    if defaults.draft:
        engine.load_draft(defaults.draft)  # load once now, not on the first request
    names = tuple(dict.fromkeys(n for n in (args.served_model_name, args.model,
                                            engine.target.name) if n))
    config = ServerConfig(names, defaults, scheduler, args.shutdown_timeout)
    print(f"verispec serve: {engine.target.name} ({engine.backend}, {engine.target.dtype}) as "
          f"{names[0]!r} on http://{args.host}:{args.port}/v1, proposer {defaults.proposer}, "
          f"k {'auto <= ' if defaults.adaptive else ''}{defaults.k}, "
          f"max_num_seqs {args.max_num_seqs}, max_queue {args.max_queue}", flush=True)
    print(f"verispec serve: the playground is at http://{args.host}:{args.port}/playground", flush=True)
    load_suffix_cache(engine, args.suffix_cache, args.suffix_max_tokens)
    serve(engine, config, args.host, args.port, args.log_level)
    save_suffix_cache(engine, args.suffix_cache)
    return 0


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible server with continuous batching",
        description="Serve /v1/completions and /v1/chat/completions (OpenAI schema, SSE "
                    "streaming), /v1/models, /health and /metrics. Running requests share one "
                    "target forward per step; each response carries a `speculation` object "
                    "(drafted, accepted, tau, proposer). The playground page is at /playground.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--proposer", default="auto", type=proposer_arg,
                   help="default proposer: auto (ngram or suffix, whichever matched longer), ngram, "
                        "suffix, draft, self:L, "
                        "none, or any registered name; a request may choose another")
    p.add_argument("--k", default="auto",
                   help="draft tokens per step: a whole number (fixed), or auto (default): "
                        "chosen per step from the cost curve and each request's acceptance, "
                        "shrinking as the batch fills")
    p.add_argument("--k-max", type=int, default=8, help="largest k that --k auto may choose")
    p.add_argument("--tree", type=int, default=0, help="token-tree node budget (0 = chains)")
    p.add_argument("--draft", default=None, help="draft model for --proposer draft: PATH or self:L")
    p.add_argument("--profile", default=None,
                   help="cost profile from `verispec profile`: the prior shape of T(n) "
                        "(default: a few forwards timed at start)")
    p.add_argument("--guard-window", type=int, default=16,
                   help="steps per window of the realized-rate check: per batch size, probe "
                        "windows alternate steps that allow drafts with steps that do not, and "
                        "adaptive requests speculate only while the first commit more tokens per "
                        "second (default 16; 0 = trust the cost model alone)")
    add_suffix_cache_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-num-seqs", type=int, default=8,
                   help="requests in the running batch; more wait in the queue (default 8)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait; past it the server answers 429 (default 64)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: --model and the model's name)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish on shutdown (default 30)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    ray = p.add_argument_group("scale-out on Ray Serve (pip install 'verispec[ray]'; docs/ray_serve.md)")
    ray.add_argument("--ray", action="store_true",
                     help="serve from Ray Serve replicas behind one endpoint, on a local Ray "
                          "cluster started here (or the one at --ray-address)")
    ray.add_argument("--ray-address", default=None,
                     help="join this Ray cluster (e.g. auto, or 10.0.0.1:6379) instead of "
                          "starting one; implies --ray")
    ray.add_argument("--replicas", default="1",
                     help="replicas, each with its own model and scheduler: N, or MIN:MAX to "
                          "autoscale on ongoing requests per replica (target --max-num-seqs)")
    ray.add_argument("--replica-cpus", type=float, default=1.0,
                     help="CPUs reserved per replica; its torch threads (default 1)")
    ray.add_argument("--replica-gpus", type=float, default=0.0,
                     help="GPUs per replica: 1 on a GPU cluster (default 0)")
    ray.add_argument("--routing", default="affinity", choices=["affinity", "pow2"],
                     help="affinity: prompts sharing their first 256 characters go to the same "
                          "replica unless it is loaded; pow2: Ray's power of two choices")
    p.set_defaults(func=cmd_serve)
