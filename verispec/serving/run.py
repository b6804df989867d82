"""One HTTP request's choices in flight: a scheduler `Ticket` per choice, whose
events the scheduler thread hands to the request's event loop with
`call_soon_threadsafe`, and what the replies need from them (text deltas held
back for stop strings, logprobs, usage, speculation statistics)."""
from __future__ import annotations

import asyncio

from fastapi import Request

from verispec.api import Engine, TextDeltas
from verispec.metrics import Stats
from verispec.serving import logprobs as lp_format
from verispec.serving.protocol import Job
from verispec.serving.provenance import ChoiceProvenance
from verispec.serving.responses import (
    CompletionLogprobs,
    CompletionTokensDetails,
    SpeculationStats,
    Usage,
)
from verispec.serving.scheduler import Failure, Progress, Scheduler, Ticket


def speculation(stats: list[Stats], proposer: str) -> SpeculationStats:
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    generated = sum(s.generated for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    return SpeculationStats(proposer=proposer, drafted=drafted, accepted=accepted,
                            acceptance_rate=round(accepted / drafted, 4) if drafted else 0.0,
                            tau=round(generated / forwards, 4) if forwards else 0.0,
                            target_forwards=forwards)


class Run:
    """One HTTP request's choices in flight: tickets out, events back on this loop."""

    def __init__(self, job: Job, scheduler: Scheduler, engine: Engine) -> None:
        self.job, self.scheduler = job, scheduler
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.tickets: list[Ticket] = []
        self.deltas: list[TextDeltas] = []
        self.stats: list[Stats | None] = []
        self.finish: list[str | None] = []
        self.token_count: list[int] = []
        self.provenance: list[ChoiceProvenance] = []
        for prompt in job.prompts:
            for j in range(job.n):
                index = len(self.tickets)
                self.tickets.append(Ticket(prompt, job.choice_sampling(j), job.spec,
                                           self._sink(index), prediction=job.prediction))
                self.deltas.append(TextDeltas(engine.decode, job.sampling.stop))
                self.stats.append(None)
                self.finish.append(None)
                self.token_count.append(0)
                if job.include_provenance:
                    self.provenance.append(ChoiceProvenance(engine.decode))
        self.open = len(self.tickets)

    def _sink(self, index: int):
        def push(event) -> None:  # on the scheduler thread
            self.loop.call_soon_threadsafe(self.events.put_nowait, (index, event))
        return push

    def submit(self) -> None:
        self.scheduler.submit(self.tickets)

    def cancel(self) -> None:
        for ticket in self.tickets:
            if not ticket.done:
                self.scheduler.cancel(ticket)

    async def next(self, request: Request | None = None) -> tuple[int, str, Progress | Failure]:
        """The next event as (choice index, text delta, event); watches for a
        disconnect while waiting when given the request."""
        while True:
            try:
                index, event = await asyncio.wait_for(self.events.get(), timeout=0.25)
                break
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    raise ConnectionAbortedError("client disconnected") from None
        delta = ""
        if isinstance(event, Progress):
            final = event.finish_reason is not None
            delta = self.deltas[index].push(event.tokens, final, event.logprobs)
            self.stats[index] = event.stats
            self.token_count[index] += len(event.tokens)
            if final:
                self.finish[index] = event.finish_reason
                self.open -= 1
        else:
            self.open -= 1
        return index, delta, event

    @property
    def wants_logprobs(self) -> bool:
        return self.job.sampling.logprobs is not None

    async def prompt_logprobs(self, engine: Engine) -> None:
        """Echo's prompt logprobs, one target forward per prompt, off the event loop."""
        self.prompt_lps = []
        self.prompt_offsets = []
        for ids in self.job.prompts:
            self.prompt_lps.append(await asyncio.to_thread(
                engine.prompt_logprobs, ids, self.job.sampling.logprobs or 0))
            self.prompt_offsets.append([len(engine.decode(ids[:i])) for i in range(len(ids))])

    def choice_logprobs(self, index: int, shown, engine: Engine):
        """A choice's (or a chunk's) logprobs object in the OpenAI shape of its route."""
        if not self.wants_logprobs:
            return None
        if self.job.chat:
            return lp_format.chat_logprobs(engine.token_text, shown)
        return lp_format.completion_logprobs(
            engine.token_text, shown,
            len(self.job.prompt_texts[index // self.job.n]) if self.job.echo else 0)

    def echo_logprobs(self, index: int, engine: Engine) -> CompletionLogprobs | None:
        if not (self.wants_logprobs and self.job.echo):
            return None
        prompt = index // self.job.n
        return lp_format.completion_logprobs(
            engine.token_text, (), 0, self.prompt_lps[prompt], self.job.prompts[prompt],
            self.prompt_offsets[prompt])

    def usage(self) -> Usage:
        prompt = sum(len(p) for p in self.job.prompts)
        completion = sum(self.token_count)
        details = {}
        if self.job.prediction is not None:
            stats = [s for s in self.stats if s is not None]
            details["completion_tokens_details"] = CompletionTokensDetails(
                accepted_prediction_tokens=sum(s.prediction_accepted for s in stats),
                rejected_prediction_tokens=sum(s.prediction_rejected for s in stats),
                reasoning_tokens=0, audio_tokens=0)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion, **details)

    def speculation(self, index: int | None = None) -> SpeculationStats:
        chosen = self.stats if index is None else [self.stats[index]]
        return speculation([s for s in chosen if s is not None], self.job.spec.proposer)
