"""The ``dynasor`` controller: stop a reasoning trace once probes show its answer has settled (Dynasor-CoT).

The trace is generated in chunks of ``chunk`` tokens. After each chunk a
probe asks for the current answer without extending the trace: the prompt is
the episode's prompt, the trace so far and the ``probe`` text; the answer is
decoded greedily, at most ``probe_tokens`` tokens. The run's verifier reads
the probe text plus its answer and gives the answer's vote key (never its
reward decides anything). A probe answer containing a hedging word
(``hedges``, e.g. "wait", "hmm") counts as no answer. When the last
``certainty`` probes gave the same answer, the trace stops: its sample is the
trace, then the probe and the probe's answer.

Probe tokens are never loss tokens: the probe text and the probe's answer
are in the sample with mask 0 (context a trainer sees, logprob 0.0), the
trace's own tokens with mask 1. A trace that ends by itself (EOS, a stop
string, ``max_tokens``) before the answers settle is kept whole, exactly as
generated. ``metadata`` records ``stopped_by: dynasor``, the probes' replies
and answers, and how many trace tokens were generated when it stopped.

Metrics: ``policy_tokens`` (trace and probe tokens), ``probe_tokens``,
``probes``, ``stopped_early`` (1.0 when the probes stopped the trace).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from typing import Annotated, Any

from annotated_types import Ge

from scaffold_core.controller import Controller
from scaffold_core.episode import EpisodeContext, Outcome
from scaffold_core.plugins import Help
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import encode

from .accounting import TokenCount, verify_texts
from .traces import Trace

DEFAULT_PROBE = "\n\nSo the final answer is"
DEFAULT_HEDGES = ("wait", "hmm", "but", "however", "alternatively", "double-check", "not sure", "maybe", "?")


class DynasorController(Controller):
    """Dynasor-CoT certainty probing (see the module docstring)."""

    def __init__(self, chunk: Annotated[int, Ge(1), Help("tokens generated between probes")] = 32,
                 certainty: Annotated[int, Ge(1), Help("probes in a row with one answer that stop the trace")] = 3,
                 probe: str = DEFAULT_PROBE, probe_tokens: Annotated[int, Ge(1), Help("tokens of a probe")] = 16,
                 probe_stop: Sequence[str] = ("\n",), hedges: Sequence[str] = DEFAULT_HEDGES,
                 min_tokens: Annotated[int, Ge(0), Help("trace tokens before probing starts")] = 0):
        if not probe.strip():
            raise ValueError("probe must be text that asks for the answer, e.g. '... Final answer: ####'")
        self.chunk, self.certainty, self.probe = chunk, certainty, probe
        self.probe_tokens, self.min_tokens = probe_tokens, min_tokens
        self.probe_stop = tuple(s for s in probe_stop if s)
        self.hedges = tuple(h.lower() for h in hedges if h)
        words = [re.escape(h) for h in self.hedges if h[0].isalnum() and h[-1].isalnum()]
        self._hedge = re.compile(r"\b(?:" + "|".join(words) + r")\b", re.IGNORECASE) if words else None
        self._marks = tuple(h for h in self.hedges if not (h[0].isalnum() and h[-1].isalnum()))

    def hedged(self, text: str) -> bool:
        """Whether a probe's answer hedges (holds a hedging word or mark)."""
        lowered = text.lower()
        return bool((self._hedge is not None and self._hedge.search(text)) or any(m in lowered for m in self._marks))

    def process(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        if ctx.tokenizer is None:
            raise ValueError("dynasor needs the episode's tokenizer (ctx.tokenizer) to append its probe")
        probe_ids = encode(ctx.tokenizer, self.probe)
        probe_sampling = SamplingParams(max_tokens=self.probe_tokens, temperature=0.0, stop=self.probe_stop)
        count = TokenCount()
        trace = Trace(0, ctx.sampling.max_tokens)
        answers: list[str | None] = []
        replies: list[str] = []
        while not trace.done:
            task = trace.next_task(ctx, self.chunk)
            yield [task]
            count.policy_tasks([task])
            trace.absorb(task, ctx.tokenizer)
            if trace.done or trace.length < self.min_tokens:
                continue
            probe = ctx.generation_task(0, prompt_ids=[*ctx.prompt_ids, *trace.output_ids, *probe_ids],
                                        sampling=probe_sampling, role="probe")
            yield [probe]
            result = probe.need_result()
            count.policy += len(result.output_ids)
            count.probe += len(result.output_ids)
            [verdict] = yield from verify_texts(ctx, [self.probe + result.text])
            replies.append(result.text)
            answers.append(None if self.hedged(result.text) else verdict.vote_key)
            recent = answers[-self.certainty:]
            if len(recent) == self.certainty and recent[0] is not None and len(set(recent)) == 1:
                generated = trace.length
                trace.insert(probe_ids)
                trace.insert(list(result.output_ids))
                trace.stop("answers_agree", "dynasor", finish="stop", trace_tokens=generated, answer=recent[0])
        trace.metadata.update(probe_answers=answers, probe_replies=replies)
        sample = trace.to_sample(ctx)
        metrics = {"probes": float(len(answers)), "stopped_early": float(trace.metadata.get("stopped_by") == "dynasor"),
                   **count.metrics()}
        if "probe_tokens" not in metrics:
            metrics["probe_tokens"] = 0.0
        return Outcome(samples=[sample], chosen=0, metrics=metrics)
