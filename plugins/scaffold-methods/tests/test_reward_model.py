"""The reward model on tiny random checkpoints made here: batched equals one by one, PRM steps, ranges."""

from __future__ import annotations

import pytest
from scaffold_testkit import build

from scaffold_core.errors import ConfigError
from scaffold_methods.reward_model import RewardModelVerifier

torch = pytest.importorskip("torch")


def scores_one_by_one(model, items):
    return [model.batcher.submit([item])[0].result(60) for item in items]


def scores_together(model, items):
    return [f.result(60) for f in model.batcher.submit(items)]


ITEMS = [("what is seven plus five", "twelve"), ("what is seven plus five", "it is thirteen I think"),
         ("", "twelve twelve twelve twelve twelve twelve"), ("what is two plus two", "four")]


def test_a_classifier_scores_the_same_batched_as_alone_within_0_1(tiny_classifier):
    model = RewardModelVerifier(checkpoint=str(tiny_classifier), batch_wait_ms=50)
    try:
        alone = scores_one_by_one(model, ITEMS)
        batches = model.batcher.batches
        together = scores_together(model, ITEMS)
        assert model.batcher.batches == batches + 1  # one forward pass for the four
        assert together == pytest.approx(alone, abs=1e-5)
        assert all(0.0 <= s <= 1.0 for s in alone) and len(set(alone)) > 1
        verdict = model.verify("twelve", "12")
        assert verdict.reward == pytest.approx(scores_one_by_one(model, [("", "twelve")])[0])
    finally:
        model.close_now()


def test_a_prm_scores_each_step_at_its_tag_and_aggregates(tiny_prm):
    path, tokenizer = tiny_prm
    response = "seven plus five\nis twelve\nso twelve"
    mins = RewardModelVerifier(checkpoint=str(path), kind="prm", step_tag=" ки", aggregate="min")
    means = RewardModelVerifier(checkpoint=str(path), kind="prm", step_tag=" ки", aggregate="mean")
    try:
        low = scores_one_by_one(mins, [("what is seven plus five", response)])[0]
        mean = scores_one_by_one(means, [("what is seven plus five", response)])[0]
        # by hand: the model's next-token distribution at each step's tag, over "+" and "-"
        ids, marks = tokenizer.encode("what is seven plus five\n", add_special_tokens=False), []
        for step in response.split("\n"):
            ids += tokenizer.encode(step, add_special_tokens=False) + tokenizer.encode(" ки", add_special_tokens=False)
            marks.append(len(ids) - 1)
        _, model, _ = mins._model
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, marks]
        good, bad = (tokenizer.encode(t, add_special_tokens=False)[0] for t in "+-")
        steps = torch.softmax(logits[:, [good, bad]].float(), dim=-1)[:, 0].tolist()
        assert len(steps) == 3
        assert low == pytest.approx(min(steps), abs=1e-5) and mean == pytest.approx(sum(steps) / 3, abs=1e-5)
        batched = scores_together(mins, [("what is seven plus five", response), ("q", "one\ntwo")])
        assert batched[0] == pytest.approx(low, abs=1e-5)
    finally:
        mins.close_now()
        means.close_now()


def test_as_a_scorer_inside_episodes_requests_are_batched_across_episodes(tiny_classifier):
    from methods_testkit import ScriptEngine, run

    from scaffold_core.sampling import SamplingParams
    from scaffold_methods.rerank import RerankController

    model = RewardModelVerifier(checkpoint=str(tiny_classifier), batch_wait_ms=30)
    rows = [{"id": f"q{i}", "question": f"what is {i} plus five", "answer": str(i + 5)} for i in range(4)]
    engine = ScriptEngine(lambda q, i: ["twelve", "thirteen", "four"][i])
    try:
        results = run(RerankController(samples=3, scorer=model), engine, rows, SamplingParams(max_tokens=16))
        assert all(r.ok for r in results), [r.error for r in results]
        assert model.batcher.items == 12 and model.batcher.batches < 12
        for result in results:
            scores = [s.metadata["score"] for s in result.samples]
            assert result.chosen == max(range(3), key=lambda i: (scores[i], -i))
            assert result.metrics["verifier_tokens"] == 0.0
    finally:
        model.close_now()


def test_bad_options_are_refused(tiny_classifier):
    for bad in ({"kind": "classifier"}, {"checkpoint": "x", "kind": "orm"}, {"checkpoint": "x", "aggregate": "max"},
                {"checkpoint": "x", "max_length": 2}):
        with pytest.raises((ConfigError, ValueError)):
            build(RewardModelVerifier, **bad)
    model = RewardModelVerifier(checkpoint=str(tiny_classifier), label=5)
    try:
        with pytest.raises(ValueError, match="label 5"):
            model.verify("twelve", "12")  # the model's error reaches the caller (the episode fails with it)
    finally:
        model.close_now()
