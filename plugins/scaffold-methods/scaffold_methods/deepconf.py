"""The ``deepconf`` controller: confidence-filtered, confidence-weighted voting (Deep Think with Confidence).

Every trace gets a confidence from its token logprobs (``confidence.py``:
the measure, the sliding window, the trace score). Answers are the run
verifier's vote keys (its canonical extracted answers; never its rewards).

``mode: offline``: ``samples`` traces are generated in full; the ``keep``
fraction with the highest confidence is kept (0.1: DeepConf-low, 0.9:
DeepConf-high), and the kept traces vote, each with its confidence as
weight (``weighted: false``: one vote each).

``mode: online``: ``warmup`` traces are generated in full and set the
threshold: the ``100 * (1 - keep)``-th percentile of their lowest group
confidences. Further traces are generated ``per_round`` at a time in chunks
of ``chunk`` tokens; a trace stops as soon as a group (window) confidence
falls below the threshold. A trace counts in the vote when it finished with
its lowest group confidence at or above the threshold (warm-up traces too),
weighted by that confidence. Before each round the vote's consensus (the
leading answer's share of the weight) is checked: at ``consensus`` or above,
no more traces are started. Online mode always scores traces by their
lowest group confidence.

Training data: every trace is a sample with its own reward from the run's
verifier. A stopped trace has ``finish_reason: truncated`` and
``metadata.stopped_by: deepconf`` (with where and why it stopped); with
``keep_stopped: false`` it is left out of the samples (its tokens still
count in ``policy_tokens``). Metrics: ``deepconf@N`` (the voted answer is
correct), ``traces``, ``stopped_traces``, ``voters``, ``policy_tokens``,
``verifier_tokens``.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le

from scaffold_core.controller import Controller
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.plugins import Help
from scaffold_core.sampling import SamplingParams
from scaffold_core.verifier import Verdict

from .accounting import TokenCount, verify_texts
from .confidence import (
    GroupConfidence,
    keep_top,
    percentile,
    token_confidences,
    trace_confidence,
    weighted_vote,
)
from .traces import TRUNCATED, Trace


class DeepConfController(Controller):
    """DeepConf@N, offline or online (see the module docstring)."""

    def __init__(self, samples: Annotated[int, Ge(1), Help("traces per prompt")] = 8,
                 mode: Literal["offline", "online"] = "offline",
                 keep: Annotated[float, Gt(0), Le(1), Help("the fraction of traces kept")] = 0.9,
                 measure: Literal["auto", "top_k", "sampled"] = "auto", top_logprobs: int = 20,
                 window: Annotated[int, Ge(1), Help("tokens of a confidence group")] = 32,
                 trace_score: Literal["lowest_group", "bottom_10", "tail", "mean"] = "lowest_group",
                 weighted: bool = True,
                 warmup: Annotated[int, Ge(1), Help("online: traces generated in full to set the threshold")] = 4,
                 chunk: Annotated[int, Ge(1), Help("tokens generated between checks")] = 32,
                 per_round: Annotated[int, Ge(1), Help("online: traces generated at a time")] = 2,
                 consensus: Annotated[float, Gt(0), Le(1),
                                      Help("online: the leading answer's share that ends the search (null: never)")]
                 | None = 0.95, keep_stopped: bool = True):
        if measure != "sampled" and top_logprobs < 2:
            raise ValueError("top_logprobs must be >= 2 for the top_k measure (DeepConf uses 20)")
        trace_confidence([1.0], window, trace_score)  # validates the name
        self.samples, self.mode, self.keep = samples, mode, keep
        self.measure, self.top_logprobs, self.window = measure, top_logprobs, window
        self.trace_score, self.weighted = trace_score, weighted
        self.warmup, self.chunk, self.per_round = min(warmup, samples), chunk, per_round
        self.consensus, self.keep_stopped = consensus, keep_stopped

    def process(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        if self.mode == "offline":
            return (yield from self._offline(ctx))
        return (yield from self._online(ctx))

    def _sampling(self, ctx: EpisodeContext) -> SamplingParams:
        return ctx.sampling if self.measure == "sampled" else ctx.sampling.replace(top_logprobs=self.top_logprobs)

    def _full_traces(self, ctx: EpisodeContext, indices: range, count: TokenCount) -> Generator[Any, Any, list[Trace]]:
        traces = [Trace(i, ctx.sampling.max_tokens) for i in indices]
        sampling = self._sampling(ctx)
        tasks = [t.next_task(ctx, t.limit, sampling) for t in traces]
        yield tasks
        count.policy_tasks(tasks)
        for trace, task in zip(traces, tasks):
            trace.absorb(task, ctx.tokenizer)
        return traces

    def _confidences(self, trace: Trace, measure: str) -> tuple[list[float], str]:
        return token_confidences(trace.generated_logprobs(), trace.generated_top(), measure)

    # -- offline ---------------------------------------------------------------------------------
    def _offline(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        count = TokenCount()
        traces = yield from self._full_traces(ctx, range(self.samples), count)
        samples = [t.to_sample(ctx) for t in traces]
        verdicts = yield from verify_texts(ctx, [s.text for s in samples])
        scores = []
        for sample, trace, verdict in zip(samples, traces, verdicts):
            sample.verdict = verdict
            confidences, used = self._confidences(trace, self.measure)
            score = trace_confidence(confidences, self.window, self.trace_score)
            sample.metadata.update(confidence=score, confidence_measure=used)
            scores.append(score)
        kept = keep_top(scores, self.keep)
        for i in kept:
            samples[i].metadata["kept"] = True
        answer, reward = self._vote(samples, kept, [scores[i] for i in kept])
        metrics = {f"deepconf@{self.samples}": float(reward > 0), "traces": float(len(traces)),
                   "voters": float(len(kept)), **count.metrics()}
        return Outcome(samples=samples, answer=answer, answer_reward=reward, metrics=metrics)

    def _vote(self, samples: list[Sample], voters: list[int], weights: list[float]) -> tuple[str | None, float]:
        keys = [_key(samples[i].verdict) for i in voters]
        key, _, _ = weighted_vote(keys, weights if self.weighted else [1.0] * len(keys))
        if key is None:
            return None, 0.0
        winner = samples[voters[keys.index(key)]].verdict
        assert winner is not None
        return winner.extracted, winner.reward

    # -- online ----------------------------------------------------------------------------------
    def _online(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        count = TokenCount()
        warm = yield from self._full_traces(ctx, range(self.warmup), count)
        measure: str = self.measure
        lowest = []
        for trace in warm:
            confidences, measure = self._confidences(trace, measure)
            lowest.append(trace_confidence(confidences, self.window, "lowest_group"))
        threshold = percentile(lowest, 100.0 * (1.0 - self.keep))
        samples = [t.to_sample(ctx) for t in warm]
        verdicts = yield from verify_texts(ctx, [s.text for s in samples])
        voters: list[int] = []
        weights: list[float] = []
        for i, (sample, verdict, score) in enumerate(zip(samples, verdicts, lowest)):
            sample.verdict = verdict
            sample.metadata.update(confidence=score, confidence_measure=measure, deepconf="warmup")
            if score >= threshold:
                voters.append(i)
                weights.append(score)
        started, stopped = len(warm), 0
        while started < self.samples and not self._agreed(samples, voters, weights):
            end = min(self.samples, started + self.per_round)
            batch = [Trace(i, ctx.sampling.max_tokens) for i in range(started, end)]
            started += len(batch)
            scores = yield from self._chunked(ctx, batch, measure, threshold, count)
            finished = [(t, s) for t, s in zip(batch, scores) if t.finish_reason != TRUNCATED]
            stopped += len(batch) - len(finished)
            new = [t.to_sample(ctx) for t, _ in finished]
            verdicts = yield from verify_texts(ctx, [s.text for s in new])
            for sample, verdict, (_, score) in zip(new, verdicts, finished):
                sample.verdict = verdict
                sample.metadata.update(confidence=score, confidence_measure=measure)
                if score >= threshold:
                    voters.append(len(samples))
                    weights.append(score)
                samples.append(sample)
            if self.keep_stopped:
                samples += [t.to_sample(ctx) for t in batch if t.finish_reason == TRUNCATED]
        answer, reward = self._vote(samples, voters, weights)
        metrics = {f"deepconf@{self.samples}": float(reward > 0), "traces": float(started),
                   "stopped_traces": float(stopped), "voters": float(len(voters)), "threshold": threshold,
                   **count.metrics()}
        return Outcome(samples=samples, answer=answer, answer_reward=reward, metrics=metrics)

    def _agreed(self, samples: list[Sample], voters: list[int], weights: list[float]) -> bool:
        """Whether the vote so far reaches ``consensus`` (the leading answer's share of the weight)."""
        if self.consensus is None:
            return False
        keys = [_key(samples[i].verdict) for i in voters]
        _, top, total = weighted_vote(keys, weights if self.weighted else [1.0] * len(keys))
        return total > 0 and top / total >= self.consensus

    def _chunked(self, ctx: EpisodeContext, batch: list[Trace], measure: str, threshold: float,
                 count: TokenCount) -> Generator[Any, Any, list[float]]:
        """Generate ``batch`` chunk by chunk, stopping each trace when a group confidence drops below the
        threshold; return each trace's lowest group confidence."""
        sampling = self._sampling(ctx)
        groups = {id(t): GroupConfidence(self.window) for t in batch}
        active = list(batch)
        while active:
            tasks = [t.next_task(ctx, self.chunk, sampling) for t in active]
            yield tasks
            count.policy_tasks(tasks)
            for trace, task in zip(active, tasks):
                added = trace.absorb(task, ctx.tokenizer)
                result = task.need_result()
                top = None if result.top_logprobs is None else result.top_logprobs[:added]
                confidences, _ = token_confidences(result.logprobs[:added], top, measure)
                new = groups[id(trace)].add(confidences)
                low = min(new) if new else math.inf
                if low < threshold:
                    trace.stop("low_confidence", "deepconf", stopped_at=trace.length, group_confidence=low,
                               threshold=threshold)
            active = [t for t in active if not t.done]
        return [min(groups[id(t)].all_groups(), default=math.nan) for t in batch]


def _key(verdict: Verdict | None) -> str | None:
    return None if verdict is None else verdict.vote_key
