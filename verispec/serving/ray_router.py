"""Prefix affinity for Ray Serve: requests whose prompts share a long prefix go
to the same replica, so state a replica keeps across requests (its pooled
acceptance estimates today; a suffix store or prefix KV cache later) is found
where it was built.

The ingress derives an `affinity` key from the request body (`affinity_key`)
and passes it as a keyword argument of the replica call; `PrefixAffinityRouter`
plugs into Ray Serve's request-router hook (`RequestRouterConfig`) and ranks
replicas by rendezvous hashing of that key (Thaler & Ravishankar 1998): every
router, in every ingress process, agrees on the order without shared state,
and when a replica dies only the keys it owned move. Load wins over affinity:
when the preferred replica has `imbalance` more requests in flight than the
least loaded one, the request is routed by power of two choices instead, as it
is when it has no key (a prompt shorter than the prefix).

Ray Serve pickles this module by value into every router and imports it where
it handles the app's config (the controller, the dashboard), so it imports
nothing from verispec beyond itself.
"""
from __future__ import annotations

import hashlib
import json
from typing import List, Optional

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)


def affinity_key(body: bytes, chat: bool, prefix_chars: int) -> Optional[str]:
    """The first `prefix_chars` characters of the prompt (chat: the messages as
    role and content), or None when the prompt is shorter or the body is not
    one the replica will accept (it then answers the error, routed anywhere)."""
    if prefix_chars <= 0:
        return None
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    if chat:
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        text = "".join(f"\x00{m.get('role')}\x01{m.get('content')}" for m in messages
                       if isinstance(m, dict))
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return text[:prefix_chars] if len(text) >= prefix_chars else None


def _score(key: str, replica: RunningReplica) -> bytes:
    return hashlib.blake2b(f"{key}\x00{replica.replica_id.unique_id}".encode(),
                           digest_size=8).digest()


class PrefixAffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(self, imbalance: int = 4) -> None:
        self.imbalance = imbalance

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if not key:
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(
                self, candidate_replicas, pending_request)
        # Called for its side effect too: it sets the routing context's backoff flag.
        allowed = self.apply_locality_routing(pending_request)
        replicas = [r for r in candidate_replicas if r.replica_id in allowed]
        if not replicas:
            return []
        ranked = sorted(replicas, key=lambda r: _score(key, r), reverse=True)
        loads = [self._replica_queue_len_cache.get(r.replica_id) for r in ranked]
        known = [q for q in loads if q is not None]
        if loads[0] is not None and known and loads[0] - min(known) > self.imbalance:
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(
                self, candidate_replicas, pending_request)
        # The first rank is taken when it has room; else the least loaded of the rest.
        return [ranked[:1], ranked[1:]]
