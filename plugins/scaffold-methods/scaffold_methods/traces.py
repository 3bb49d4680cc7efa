"""A response generated over several engine calls, kept token by token as the engine sampled it.

Methods that stop a response part-way (DeepConf online, Dynasor) or grow it
step by step (tree search) generate it in chunks: each call's prompt is the
episode's prompt plus every id generated so far, with ``max_tokens`` set to
the chunk. A :class:`Trace` concatenates the calls' output ids, logprobs and
top logprobs exactly as returned (the ids are never re-tokenized), so the
finished :class:`~scaffold_core.episode.Sample` is what one long call would
have produced: the same token ids, each with the logprob it was sampled with.

Inserted text (a Dynasor probe) and anything generated under it are added
with mask 0: they are context in the training sequence, never loss tokens,
and their logprobs are 0.0.

A stop string split across two chunks is found here (each engine call sees
only its own output): the trace is cut right after the token that completes
it, as a single call would have stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaffold_core.episode import EpisodeContext, Sample
from scaffold_core.generation import GenerationTask
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import response_text

#: ``finish_reason`` of a sample a method stopped before it finished (DeepConf's low-confidence stop);
#: ``metadata["stopped_by"]`` names the method and ``metadata["stop_reason"]`` why.
TRUNCATED = "truncated"


@dataclass(eq=False)
class Trace:
    """One response of an episode, built from one or more engine calls.

    ``index`` is the sample index within the controller (what
    ``ctx.generation_task`` takes); ``limit`` the most tokens it may
    generate (the episode's ``max_tokens`` unless a method sets less).
    """

    index: int
    limit: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = field(default_factory=list)
    finish_reason: str | None = None
    sample_index: int | None = None
    calls: int = 0
    generated: int = 0  # every token the engine generated for this trace (cut-off tokens included)
    versions: list[int] = field(default_factory=list)  # per output id: the weight version (-1: inserted)
    weights: list[Any] = field(default_factory=list)  # per engine call: its result's weight_version
    chunk_texts: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def length(self) -> int:
        """Tokens of the response itself (mask 1)."""
        return len(self.output_ids) - self.mask.count(0)

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.length)

    def next_task(self, ctx: EpisodeContext, max_tokens: int, sampling: SamplingParams | None = None,
                  **metadata: Any) -> GenerationTask:
        """The engine call that continues this trace by at most ``max_tokens`` tokens."""
        if self.done:
            raise RuntimeError(f"trace {self.index} is finished ({self.finish_reason}); it takes no more tokens")
        budget = min(max_tokens, self.remaining)
        if budget < 1:
            raise RuntimeError(f"trace {self.index} has no tokens left (limit {self.limit})")
        sp = (sampling or ctx.sampling).replace(max_tokens=budget)
        prompt = ctx.prompt_ids if not self.output_ids else [*ctx.prompt_ids, *self.output_ids]
        return ctx.generation_task(self.index, prompt_ids=prompt, sampling=sp, **metadata)

    def absorb(self, task: GenerationTask, tokenizer: Any = None) -> int:
        """Append a finished call's output; returns how many tokens it added (after a split stop string).

        ``tokenizer`` (the episode's) lets a stop string split across calls be
        found; without one such a split goes unnoticed.
        """
        result = task.need_result()
        if self.sample_index is None:
            self.sample_index = task.sample_index
        ids, logprobs = list(result.output_ids), list(result.logprobs)
        self.calls += 1
        self.generated += len(ids)
        finish: str | None = result.finish_reason if result.finish_reason == "stop" else None
        stops = task.sampling.stop
        if finish is None and stops and tokenizer is not None and self.output_ids:
            cut = _split_stop(tokenizer, self.output_ids, self.mask, ids, stops)
            if cut is not None:
                ids, logprobs, finish = ids[:cut], logprobs[:cut], "stop"
        start = len(self.output_ids)
        self.output_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.mask.extend([1] * len(ids))
        self._extend_top(result.top_logprobs, len(ids))
        self.versions.extend(result.token_versions()[:len(ids)])
        self.weights.append(result.weight_version if result.versions is None or result.weight_version is not None
                            else min(result.versions, default=None))
        self.chunk_texts.append(result.text)
        if finish is None and self.length >= self.limit:
            finish = "length"
        self.finish_reason = finish
        return len(self.output_ids) - start

    def _extend_top(self, top: list[dict[int, float]] | None, n: int) -> None:
        if self.top_logprobs is None:
            return
        if top is None:
            self.top_logprobs = None  # one call without them: the trace has none
        else:
            self.top_logprobs.extend(top[:n])

    def insert(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append tokens with mask 0 (a probe and its answer): in the sequence, never loss tokens."""
        self.output_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.mask.extend([0] * len(ids))
        self.versions.extend([-1] * len(ids))
        if self.top_logprobs is not None:
            self.top_logprobs.extend({} for _ in ids)

    def stop(self, reason: str, method: str, finish: str = TRUNCATED, **details: Any) -> None:
        """Mark the trace stopped by ``method`` before it finished."""
        self.finish_reason = finish
        self.metadata.update(stopped_by=method, stop_reason=reason, **details)

    def generated_logprobs(self) -> list[float]:
        """Logprobs of the response's own tokens (mask 1), in order."""
        return [lp for lp, m in zip(self.logprobs, self.mask) if m]

    def generated_top(self) -> list[dict[int, float]] | None:
        if self.top_logprobs is None:
            return None
        return [top for top, m in zip(self.top_logprobs, self.mask) if m]

    def text(self, tokenizer: Any = None, stops: tuple[str, ...] = ()) -> str:
        """The response text.

        One engine call and nothing inserted: the engine's own text. Otherwise
        every output id decoded (special tokens skipped) and cut at the first
        stop string, as an engine does; without a tokenizer, the calls' texts
        joined.
        """
        if self.calls == 1 and len(self.chunk_texts) == 1 and 0 not in self.mask:
            return self.chunk_texts[0]
        if tokenizer is not None and hasattr(tokenizer, "decode"):
            return response_text(tokenizer, self.output_ids, stops)
        return "".join(self.chunk_texts)

    def to_sample(self, ctx: EpisodeContext, text: str | None = None) -> Sample:
        """The trace as a training sample (prompt ids + output ids, mask 0 on inserted tokens)."""
        known = [v for v in self.weights if v is not None]  # weights may change between calls: the oldest
        metadata = dict(self.metadata)
        metadata.setdefault("engine_calls", self.calls)
        sample = Sample(
            prompt_ids=ctx.prompt_ids, output_ids=list(self.output_ids), output_logprobs=list(self.logprobs),
            output_mask=list(self.mask), text=self.text(ctx.tokenizer, ctx.sampling.stop) if text is None else text,
            finish_reason=self.finish_reason or "length",
            sample_index=self.sample_index if self.sample_index is not None else ctx.sample_base + self.index,
            weight_version=known[0] if known else None, versions=list(self.versions) if known else None,
            metadata=metadata,
        )
        return sample


def _split_stop(tokenizer: Any, before: list[int], mask: list[int], new: list[int],
                stops: tuple[str, ...]) -> int | None:
    """How many of ``new`` ids to keep when a stop string straddles the previous call and this one.

    An engine finds stop strings inside its own output; one that begins in
    the earlier text and ends in the new one is found here: the first ``j``
    with such a match in the text of ``before + new[:j]`` is where one call
    would have stopped.
    """
    own = [t for t, m in zip(before, mask) if m]
    tail = own[-64:]  # a stop string spans few tokens: decode only the tail
    longest = max(len(s) for s in stops)
    base = len(str(tokenizer.decode(tail, skip_special_tokens=True)))
    for j in range(1, len(new) + 1):
        text = str(tokenizer.decode(tail + new[:j], skip_special_tokens=True))
        for stop in stops:
            if stop and len(stop) > 1:
                start = max(0, base - len(stop) + 1)
                at = text.find(stop, start, base + len(stop) - 1)
                if 0 <= at < base:  # begins in the earlier text, ends in the new one
                    return j
        if len(text) - base >= longest:
            return None  # past any stop string that could have begun before this call
    return None
