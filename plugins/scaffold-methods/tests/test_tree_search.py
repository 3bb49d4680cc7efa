"""Tree search on a scripted tree: expansion order, pruning, the token budget, what becomes training data."""

from __future__ import annotations

from collections import Counter

import pytest
from methods_testkit import ASSISTANT, run
from scaffold_testkit import ScriptedEngine, build

from scaffold_core.errors import ConfigError
from scaffold_core.sampling import SamplingParams
from scaffold_methods.scoring import Scores
from scaffold_methods.tree_search import TreeSearchController

ROWS = [{"id": "q", "question": "What is 7 + 5?", "answer": "12"}]
SAMPLING = SamplingParams(max_tokens=64, temperature=1.0, seed=3)
#: path so far -> the steps its children take, in order
TREE = {
    "": ["A\n", "B\n"],
    "A\n": ["A1\n", "A2 #### 5"],
    "B\n": ["B1 #### 12", "B2\n"],
    "A\nA1\n": ["#### 3", "#### 4"],
    "B\nB2\n": ["#### 12", "#### 13"],
}
SCORES = {"A\n": 0.9, "B\n": 0.5, "A\nA1\n": 0.2, "A\nA2 #### 5": 0.3, "B\nB1 #### 12": 0.8, "B\nB2\n": 0.7,
          "A\nA1\n#### 3": 0.1, "A\nA1\n#### 4": 0.15, "B\nB2\n#### 12": 0.6, "B\nB2\n#### 13": 0.65}


class TreeEngine(ScriptedEngine):
    """The ``k``-th request with a given prompt takes the ``k``-th step of ``TREE`` for its path."""

    def __init__(self):
        super().__init__(self.step)
        self.seen: Counter[str] = Counter()

    def step(self, prompt, request):
        path = prompt.rpartition(ASSISTANT)[2]
        k = self.seen[prompt]
        self.seen[prompt] += 1
        return TREE[path][k % len(TREE[path])]


class TableScorer:
    """Scores paths from ``SCORES`` (None when absent), one verifier token each; records what it scored."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def episode_scores(self, ctx, question, responses, partial=False):
        self.calls.append(list(responses))
        return Scores([SCORES.get(r) for r in responses], len(responses), ["table"] * len(responses))
        yield  # a generator, like every scorer


def search(**options):
    scorer = TableScorer()
    engine = TreeEngine()
    controller = TreeSearchController(**{"expansions": 2, "depth": 3, "scorer": scorer, **options})
    [result] = run(controller, engine, ROWS, SAMPLING)
    assert result.ok, result.error
    return result, scorer, engine


def test_beam_keeps_the_best_paths_each_round():
    result, scorer, _ = search(strategy="beam", width=1)
    assert scorer.calls == [["A\n", "B\n"], ["A\nA1\n", "A\nA2 #### 5"], ["A\nA1\n#### 3", "A\nA1\n#### 4"]]
    assert [s.text for s in result.samples] == ["A\nA2 #### 5", "A\nA1\n#### 4", "A\nA1\n#### 3"]  # by score
    assert result.chosen == 0 and result.answer == "5" and result.metrics["tree@answer"] == 0.0
    assert result.metrics["expanded"] == 1 + 1 + 1 and result.metrics["complete_paths"] == 3
    wide, _, _ = search(strategy="beam", width=2)
    assert wide.samples[0].text == "B\nB1 #### 12" and wide.metrics["tree@answer"] == 1.0


def test_best_first_expands_the_best_frontier_path_until_a_complete_one_leads():
    result, scorer, _ = search(strategy="best_first", width=2)
    assert scorer.calls == [["A\n", "B\n"], ["A\nA1\n", "A\nA2 #### 5"], ["B\nB1 #### 12", "B\nB2\n"]]
    assert result.samples[0].text == "B\nB1 #### 12" and result.answer == "12" and result.chosen == 0
    assert result.metrics["expanded"] == 3
    # the other complete path left in the frontier is training data too; A2 was pruned (width 2)
    assert [s.text for s in result.samples] == ["B\nB1 #### 12"]


def test_samples_are_whole_paths_with_their_tokens_and_counts():
    result, scorer, engine = search(strategy="beam", width=2)
    best = result.samples[0]
    tok = engine.tokenizer
    assert best.output_ids == tok.encode("B\n") + tok.encode("B1 #### 12") + [tok.eos_token_id]
    assert best.output_mask == [1] * len(best.output_ids) and best.reward == 1.0
    assert len({s.sample_index for s in result.samples}) == len(result.samples)
    # rounds of 2, 4 and 4 children (width 2 keeps A1 and B2 for the last round)
    assert [len(c) for c in scorer.calls] == [2, 4, 4] and result.metrics["expanded"] == 1 + 2 + 2
    assert result.metrics["verifier_tokens"] == 10
    steps = [step for path in ("", "A\n", "B\n", "A\nA1\n", "B\nB2\n") for step in TREE[path]]
    assert result.metrics["policy_tokens"] == sum(len(step) + (not step.endswith("\n")) for step in steps)
    assert result.metrics["complete_paths"] == 6 and len(result.samples) == 6


def test_the_budget_is_never_exceeded():
    result, scorer, engine = search(strategy="beam", width=2, budget=5)
    assert result.metrics["policy_tokens"] <= 5
    assert [r.sampling.max_tokens for r in engine.requests] == [2, 2]  # 5 tokens shared by two children
    assert len(scorer.calls) == 1  # the next round could not afford a token per child
    [sample] = result.samples  # no path completed: the best partial one, marked truncated
    assert sample.text == "A" and sample.finish_reason == "truncated"  # the engine cut its text at the delimiter
    assert sample.metadata["stopped_by"] == "tree_search"


def test_keep_partial_adds_unfinished_paths():
    result, _, _ = search(strategy="beam", width=2, budget=5, keep_partial=True)
    assert [(s.text, s.finish_reason) for s in result.samples] == [("A", "truncated"), ("B", "truncated")]
    assert result.chosen == 0


@pytest.mark.parametrize("bad", [{"strategy": "mcts"}, {"width": 0}, {"expansions": 0}, {"depth": 0},
                                 {"budget": 0}, {"delimiter": ""}])
def test_bad_options_are_refused(bad):
    with pytest.raises((ConfigError, ValueError)):
        build(TreeSearchController, **{"scorer": TableScorer(), **bad})
