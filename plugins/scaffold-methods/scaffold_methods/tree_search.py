"""The ``tree_search`` controller: step-level beam search or best-first search, scored by a process reward.

A step is one engine call that stops at ``delimiter`` (default a newline),
at most ``step_tokens`` tokens; the step after ``depth - 1`` steps is left to
run to the end of the response. A path is complete when a step ends the
response (EOS or ``max_tokens``). Every new path is scored as a partial
solution by the ``scorer`` (default ``self_eval``: the policy answers
whether the steps so far are correct; or ``{name: reward_model, ...}``, a
judge, any verifier).

``strategy: beam``: every kept path is expanded into ``expansions``
children per round; complete children are set aside, and the ``width`` best
of the others (ties: the earlier path) are kept for the next round.

``strategy: best_first``: the frontier holds the ``width`` best paths. Each
round pops the best one (ties: the earlier path) and expands it into
``expansions`` children; the search ends when the popped path is complete
(a complete path at the top of the frontier is the answer).

``budget`` caps the policy tokens of the search (the scorer's tokens are
counted apart): a round's steps share what is left, so the budget is never
exceeded; when nothing is left, or after ``depth`` rounds, the search ends.
The episode's answer is the best complete path (the best partial one when
none completed, with ``finish_reason: truncated``).

Training data: every complete path is a sample (its steps' tokens, mask 1,
with their logprobs), chosen = the answer; with ``keep_partial: true`` the
paths left unfinished are samples too (``finish_reason: truncated``).
Metrics: ``tree@answer`` (the answer is correct), ``expanded`` (paths
expanded), ``complete_paths``, ``policy_tokens``, ``verifier_tokens``.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, MinLen

from scaffold_core.controller import Controller
from scaffold_core.episode import EpisodeContext, Outcome
from scaffold_core.plugins import Help
from scaffold_core.tokenizers import response_text

from .accounting import TokenCount, question_of, verify_texts
from .scoring import ScorerLifetime, make_scorer, rank_key
from .traces import TRUNCATED, Trace


@dataclass(eq=False)
class Node:
    """A path of the tree: the trace of its steps, its depth, score and creation order."""

    trace: Trace
    depth: int
    order: int
    score: float | None = None
    complete: bool = False
    steps: list[str] = field(default_factory=list)

    def key(self) -> tuple[int, float, int]:
        return rank_key(self.score, self.order)


class TreeSearchController(ScorerLifetime, Controller):
    """Step-level tree search (see the module docstring)."""

    shared: ClassVar[tuple[str, ...]] = ("scorer",)

    def __init__(self, strategy: Literal["beam", "best_first"] = "beam",
                 width: Annotated[int, Ge(1), Help("nodes kept per level")] = 2,
                 expansions: Annotated[int, Ge(1), Help("children per node")] = 2,
                 depth: Annotated[int, Ge(1), Help("steps at most")] = 4,
                 delimiter: Annotated[str, MinLen(1), Help("the text that ends a step")] = "\n",
                 step_tokens: Annotated[int, Ge(1), Help("tokens of one step at most")] = 64,
                 budget: Annotated[int, Ge(1), Help("tokens in all (null: no cap)")] | None = None,
                 scorer: Any = "self_eval", keep_partial: bool = False):
        self.strategy, self.width, self.expansions, self.depth = strategy, width, expansions, depth
        self.delimiter, self.step_tokens, self.budget, self.keep_partial = delimiter, step_tokens, budget, keep_partial
        self.scorer = make_scorer(scorer, "controller.scorer")

    def process(self, ctx: EpisodeContext) -> Generator[Any, Any, Outcome]:
        state = _Search(ctx, self)
        if self.strategy == "beam":
            yield from state.beam()
        else:
            yield from state.best_first()
        return (yield from state.outcome())


class _Search:
    """One episode's search: its nodes, counters and budget."""

    def __init__(self, ctx: EpisodeContext, options: TreeSearchController):
        self.ctx, self.o = ctx, options
        self.count = TokenCount()
        self.made = 0
        self.expanded = 0
        self.complete: list[Node] = []
        self.open: list[Node] = []  # paths left unfinished when the search ended
        self.question = question_of(ctx)

    def left(self) -> int | None:
        return None if self.o.budget is None else self.o.budget - self.count.policy

    def expand(self, parents: list[Node]) -> Generator[Any, Any, list[Node]]:
        """Children of ``parents`` (``expansions`` each, in parent order), generated and scored in one round."""
        n = len(parents) * self.o.expansions
        left = self.left()
        share = self.o.step_tokens if left is None else min(self.o.step_tokens, left // n)
        ctx = self.ctx
        children, tasks = [], []
        for parent in parents:
            last = parent.depth + 1 >= self.o.depth
            cap = parent.trace.remaining if last else min(share, parent.trace.remaining)
            if left is not None:
                cap = min(cap, left // n)
            if cap < 1:
                return []
            for _ in range(self.o.expansions):
                trace = _fork(parent.trace, self.made)
                stops = ctx.sampling.stop if last else (*ctx.sampling.stop, self.o.delimiter)
                tasks.append(trace.next_task(ctx, cap, ctx.sampling.replace(stop=stops)))
                children.append(Node(trace, parent.depth + 1, self.made, steps=list(parent.steps)))
                self.made += 1
        self.expanded += len(parents)
        yield tasks
        self.count.policy_tasks(tasks)
        for child, task in zip(children, tasks):
            before = len(child.trace.output_ids)
            child.trace.absorb(task, ctx.tokenizer)
            child.steps.append(task.need_result().text)
            finish = child.trace.finish_reason
            stepped = child.depth < self.o.depth  # the delimiter was a stop string of this call
            at_delimiter = stepped and finish == "stop" and _ends_step(ctx.tokenizer, child.trace.output_ids, before,
                                                                       self.o.delimiter)
            child.complete = finish == "length" or (finish == "stop" and not at_delimiter)
            if not child.complete:
                child.trace.finish_reason = None  # a step boundary: the path goes on
        texts = [_path_text(ctx, c.trace) for c in children]
        scores = yield from self.o.scorer.episode_scores(ctx, self.question, texts, partial=True)
        self.count.verifier += scores.tokens
        for child, value in zip(children, scores.values):
            child.score = value
        return children

    def beam(self) -> Generator[Any, Any, None]:
        frontier = [Node(Trace(0, self.ctx.sampling.max_tokens), 0, -1)]
        for _ in range(self.o.depth):
            children = yield from self.expand(frontier)
            if not children:
                break
            self.complete += [c for c in children if c.complete]
            frontier = sorted((c for c in children if not c.complete), key=Node.key)[: self.o.width]
            if not frontier:
                break
        self.open = frontier

    def best_first(self) -> Generator[Any, Any, None]:
        root = Node(Trace(0, self.ctx.sampling.max_tokens), 0, -1)
        heap: list[tuple[tuple[int, float, int], int, Node]] = [(root.key(), root.order, root)]
        rounds = 0
        while heap:
            _, _, node = heapq.heappop(heap)
            if node.complete:
                self.complete.append(node)
                break
            if rounds >= self.o.depth * self.o.width:  # at most depth x width expansions
                heapq.heappush(heap, (node.key(), node.order, node))
                break
            children = yield from self.expand([node])
            rounds += 1
            if not children:
                heapq.heappush(heap, (node.key(), node.order, node))
                break
            for child in children:
                if child.complete or child.depth < self.o.depth:
                    heapq.heappush(heap, (child.key(), child.order, child))
            heap = heapq.nsmallest(self.o.width, heap)  # the frontier keeps the width best paths
            heapq.heapify(heap)
        self.complete += [n for _, _, n in heap if n.complete and n not in self.complete]
        self.open = [n for _, _, n in sorted(heap, key=lambda item: item[0]) if not n.complete]

    def outcome(self) -> Generator[Any, Any, Outcome]:
        ctx = self.ctx
        ranked = sorted(self.complete, key=Node.key)
        partial = sorted((n for n in self.open if n.depth > 0), key=Node.key)
        if not ranked and partial:
            ranked, partial = [partial[0]], partial[1:]
        nodes = ranked + (partial if self.o.keep_partial else [])
        samples = []
        for position, node in enumerate(nodes):
            if not node.complete:
                node.trace.stop("search_ended", "tree_search", finish=TRUNCATED)
            sample = node.trace.to_sample(ctx)
            sample.sample_index = ctx.sample_base + position  # paths share their root's index: number them apart
            sample.metadata.update(score=node.score, depth=node.depth, steps=len(node.steps))
            samples.append(sample)
        verdicts = yield from verify_texts(ctx, [s.text for s in samples])
        for sample, verdict in zip(samples, verdicts):
            sample.verdict = verdict
        metrics = {"expanded": float(self.expanded), "complete_paths": float(len(self.complete)),
                   **self.count.metrics()}
        if not samples:  # nothing was generated (a budget below one token per step)
            return Outcome(samples=[], metrics={**metrics, "tree@answer": 0.0})
        chosen = samples[0].verdict
        assert chosen is not None
        metrics["tree@answer"] = float(chosen.correct)
        return Outcome(samples=samples, chosen=0, answer=chosen.extracted, metrics=metrics)


def _fork(trace: Trace, index: int) -> Trace:
    """A copy of ``trace`` to grow one more step (its own lists; the sample index of the root)."""
    return Trace(index=trace.index, limit=trace.limit, output_ids=list(trace.output_ids),
                 logprobs=list(trace.logprobs), mask=list(trace.mask),
                 top_logprobs=None if trace.top_logprobs is None else list(trace.top_logprobs),
                 sample_index=trace.sample_index, calls=trace.calls, generated=trace.generated,
                 versions=list(trace.versions), weights=list(trace.weights), chunk_texts=list(trace.chunk_texts),
                 metadata={"node": index})


def _ends_step(tokenizer: Any, ids: list[int], before: int, delimiter: str) -> bool:
    """Whether the step ``ids[before:]`` stopped at the delimiter (rather than at EOS or another stop string).

    The engine stops at the first delimiter, so the step ended at one exactly when a delimiter ends inside
    the step's text (one begun in the previous step included).
    """
    if tokenizer is None:
        return True  # no way to tell: a stop is read as a step boundary (depth still ends the path)
    earlier = len(response_text(tokenizer, ids[:before]))
    text = response_text(tokenizer, ids)
    return text.find(delimiter, max(0, earlier - len(delimiter) + 1)) >= 0


def _path_text(ctx: EpisodeContext, trace: Trace) -> str:
    if ctx.tokenizer is None:
        return "".join(trace.chunk_texts)
    return response_text(ctx.tokenizer, trace.output_ids, ctx.sampling.stop)
