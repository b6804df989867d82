"""The playground page that `verispec serve` hosts at /playground.

Static files (verispec/serving/web/: no build step, no CDN, nothing fetched
from outside the server) and two small JSON endpoints beside the OpenAI API
the page streams from:

- GET /playground/api/info: the served model and the speculation choices a
  request may make;
- GET /playground/api/economics: `verispec calc` and `verispec simulate` for
  one (alpha, k, draft cost, verify overhead), plus the curve over k, so the
  page draws verispec's own numbers and holds no copy of the formulas.

The Live and Race views call /v1/chat/completions (or /v1/completions) with
`stream_options.include_provenance` (verispec.serving.provenance).
"""
from __future__ import annotations

import math
from pathlib import Path

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

# The one import of the economics code: the closed forms and the Monte-Carlo.
from verispec.bench import calculator, simulate
from verispec.policy import economics

WEB = Path(__file__).with_name("web")
K_MAX = 32
MAX_ROUNDS = 4096
SPREAD_TRIALS = 200


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def economics_report(alpha: float, k: int, draft_cost: float, verify_overhead: float,
                     k_max: int = 16, rounds: int = 24, seed: int = 0) -> dict:
    """Everything the economics widget shows, from verispec's economics code.
    Raises ValueError on an out-of-range argument."""
    if not 1 <= k_max <= K_MAX:
        raise ValueError(f"k_max must be in [1, {K_MAX}], got {k_max}")
    if not 0 <= k <= K_MAX:
        raise ValueError(f"k must be in [0, {K_MAX}], got {k}")
    if not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds must be in [1, {MAX_ROUNDS}], got {rounds}")
    cost = economics.CostModel(draft_cost=draft_cost, verify_overhead=verify_overhead)
    best = calculator.optimal_k(alpha, cost, k_max)
    run = simulate.simulate(alpha, k, rounds, seed, cost)
    spread = simulate.spread_by_rounds(alpha, k, trials=SPREAD_TRIALS, seed=seed)
    return {
        "alpha": alpha, "k": k, "draft_cost": draft_cost, "verify_overhead": verify_overhead,
        "k_max": k_max,
        "expected_tokens": calculator.expected_tokens(alpha, k),
        "expected_speedup": calculator.expected_speedup(alpha, k, cost),
        "pass_cost": cost.pass_cost(k),
        "optimal_k": best.k, "optimal_speedup": best.speedup,
        "ceiling": _finite(calculator.ceiling(cost)),
        "curve": [{"k": j, "expected_tokens": calculator.expected_tokens(alpha, j),
                   "speedup": calculator.expected_speedup(alpha, j, cost)}
                  for j in range(k_max + 1)],
        "simulation": {"rounds": run.rounds, "seed": seed,
                       "tokens_per_pass": run.tokens_per_pass, "theoretical": run.theoretical,
                       "speedup": run.speedup, "theoretical_speedup": run.theoretical_speedup,
                       "round_tokens": simulate.round_tokens(alpha, k, rounds, seed)},
        "spread": [vars(row) for row in spread], "spread_trials": SPREAD_TRIALS,
    }


def _error(message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "param": param, "code": "invalid_value"}}, status_code=400)


def router(engine, config) -> APIRouter:
    from verispec import proposers

    api = APIRouter()
    defaults = config.defaults

    @api.get("/playground", include_in_schema=False)
    async def page():
        return FileResponse(WEB / "index.html", media_type="text/html")

    @api.get("/playground/api/info")
    async def info():
        target = engine.target
        return {
            "model": config.served_names[0], "backend": engine.backend,
            "max_context": target.max_context, "num_layers": target.num_layers,
            "chat": bool(getattr(engine.tokenizer, "chat_template", None)),
            "proposers": list(proposers.available()),
            "drafts": [*defaults.allowed_drafts,
                       *(f"self:{n}" for n in range(1, target.num_layers + 1))],
            "defaults": {"proposer": defaults.proposer, "k": defaults.k,
                         "adaptive": defaults.adaptive, "tree": defaults.tree,
                         "draft": defaults.draft},
            "k_max": K_MAX,
        }

    # A plain def: FastAPI runs it on a worker thread, off the loop that streams tokens.
    @api.get("/playground/api/economics")
    def economics_endpoint(
            alpha: float = Query(..., description="acceptance rate in [0, 1)"),
            k: int = Query(4, description="draft length"),
            draft_cost: float = Query(0.0, description="draft cost per token, relative to a decode step"),
            verify_overhead: float = Query(0.0, description="extra verify cost per position"),
            k_max: int = Query(16), rounds: int = Query(24), seed: int = Query(0)):
        try:
            return economics_report(alpha, k, draft_cost, verify_overhead, k_max, rounds, seed)
        except ValueError as exc:
            return _error(str(exc))

    return api


def mount(app: FastAPI, engine, config) -> None:
    """Add the page, its assets and endpoints; `/` redirects to the page when no
    other route has claimed it."""
    app.include_router(router(engine, config))
    app.mount("/playground/static", StaticFiles(directory=WEB), name="playground-static")
    if not any(getattr(route, "path", None) == "/" for route in app.routes):
        app.add_api_route("/", lambda: RedirectResponse("/playground"), include_in_schema=False)
