"""The rollout_func contract with TRL, checked without a model: TRL's repeated prompts map to scaffold's
groups, the output has one non-empty completion per entry with one logprob per token, and what TRL
would accept silently (wrong lengths, missing samples) fails here with a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import scaffold_testkit.plugin as test_tasks
from scaffold_testkit import ListTask, ScriptedEngine, plugin_set

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.config import load_config
from scaffold_core.run.assembly import Components
from scaffold_core.sampling import SamplingParams
from scaffold_core.train.prompt_groups import RolloutGroup, TrainingRollouts
from scaffold_core.trajectory import TrainingSample
from scaffold_trl.loop_thread import LoopThread
from scaffold_trl.rollout import REWARD_KEY, PromptIndex, RolloutBridge, scaffold, split_groups, to_trl_output

ROWS = [{"id": "a", "question": "1 + 1?", "answer": "2"}, {"id": "b", "question": "2 + 2?", "answer": "4"},
        {"id": "c", "question": "1 + 1?", "answer": "2"}]  # c repeats a's prompt text: another task all the same


class FakeState:
    global_step = 0


class FakeTrainer:
    """What rollout_func reads from GRPOTrainer."""

    num_generations = 3
    num_generations_eval = 3
    state = FakeState()

    class model:  # noqa: N801 - mimics trainer.model.training
        training = True


def test_prompts_repeated_back_to_back_become_groups():
    assert split_groups(["x", "x", "y", "y"], 2) == ["x", "y"]
    with pytest.raises(RuntimeError, match="not a multiple of num_generations"):
        split_groups(["x", "x", "y"], 2)
    with pytest.raises(RuntimeError, match="group 1 mixes prompts"):
        split_groups(["x", "x", "y", "x"], 2)


def sample(prompt_len=2, completion=(5, 6), logprobs=(-0.5, -0.25), reward=1.0):
    ids = list(range(prompt_len)) + list(completion)
    n = len(completion)
    return TrainingSample(ids, [0] * prompt_len + [1] * n, [0.0] * prompt_len + list(logprobs),
                          [-1] * prompt_len + [0] * n, reward, 0.0, "e", 0, "g", prompt_len, "stop")


def group(*samples, failed=()):
    g = RolloutGroup(group_id="g@0", index=0, row={})
    g.samples = list(samples)
    g.episodes = list(failed)
    return g


def test_output_is_checked_where_trl_would_not():
    out = to_trl_output([group(sample(), sample(reward=0.0))], 2)
    assert out["prompt_ids"] == [[0, 1], [0, 1]] and out["completion_ids"] == [[5, 6], [5, 6]]
    assert out["logprobs"] == [[-0.5, -0.25]] * 2 and out["env_mask"] == [[1, 1]] * 2
    assert out[REWARD_KEY] == [1.0, 0.0] and scaffold(["a", "b"], out[REWARD_KEY]) == [1.0, 0.0]
    padded = to_trl_output([group(sample(), sample(reward=0.0))], 2, slots=2, pad_id=9)
    assert padded["completion_ids"][2:] == [[9], [9]] and padded["prompt_ids"][2:] == [[9], [9]]
    assert padded["env_mask"][2:] == [[0], [0]] and padded[REWARD_KEY][2:] == [None, None]
    assert all(len(v) == 4 for v in padded.values())
    with pytest.raises(RuntimeError, match="produced 1 of 2 samples"):
        to_trl_output([group(sample())], 2)
    with pytest.raises(RuntimeError, match="no completion tokens"):
        to_trl_output([group(sample(completion=(), logprobs=()))], 1)
    bad = sample()
    bad.logprobs = bad.logprobs[:-1]
    with pytest.raises(RuntimeError, match="1 logprobs for 2 completion tokens"):
        to_trl_output([group(bad)], 1)


def test_the_bridge_answers_trl_with_one_completion_per_entry_in_order():
    engine = ScriptedEngine(lambda prompt, request: "2" if "1 + 1" in prompt else "5")
    engine.weight_version = 0
    rollouts = TrainingRollouts(Components(task=ListTask(ROWS), controller=NativeController(), engine=engine,
                                           verifier=ExactMatchVerifier()), sampling=SamplingParams(max_tokens=8))
    loop = LoopThread()
    try:
        loop.run(rollouts.start(), 30)
        index = PromptIndex(rollouts)
        assert index.same_text == 1 and index.prompts == ["a", "b", "c"]  # rows by identity, never by text
        bridge = RolloutBridge(rollouts, index, loop)
        b, a = index.prompts[1], index.prompts[0]
        out = bridge([b, b, b, a, a, a], FakeTrainer())
        with pytest.raises(RuntimeError, match="not one of the task's rows"):
            bridge(["other"] * 3, FakeTrainer())
    finally:
        loop.run(rollouts.close(), 30)
        loop.stop()
    assert out[REWARD_KEY] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert all(len(c) == len(lp) > 0 for c, lp in zip(out["completion_ids"], out["logprobs"]))
    record = bridge.history[0]
    assert record.version == 0 and record.metrics["completions"] == 6 and record.metrics["reward_mean"] == 0.5
    assert record.groups is None  # earlier steps keep their figures only: memory stays flat in steps
    assert len({s.episode_id for s in bridge.latest.samples}) == 6  # six episodes, six seeds, held until the next call
    assert not record.skipped  # filter_groups none: every group is kept, even those with equal rewards


def test_groups_with_equal_rewards_are_refilled_then_padded_and_the_step_is_skipped():
    """Every group here has equal rewards (the scripted model always answers '2'): the bridge draws the task's
    other rows (bounded), and with nothing informative hands TRL padding only, which trains nothing."""
    from scaffold_core.train.filtering import GroupFilter

    engine = ScriptedEngine(lambda prompt, request: "2")
    engine.weight_version = 0
    rows = [{"id": f"r{i}", "question": f"{i} + 1?", "answer": str(i + 1)} for i in range(5)]
    rollouts = TrainingRollouts(Components(task=ListTask(rows), controller=NativeController(), engine=engine,
                                           verifier=ExactMatchVerifier()), sampling=SamplingParams(max_tokens=8))
    loop = LoopThread()
    try:
        loop.run(rollouts.start(), 30)
        index = PromptIndex(rollouts)
        bridge = RolloutBridge(rollouts, index, loop, group_filter=GroupFilter("zero_variance", 2), seed=0,
                               pad_id=7)
        out = bridge([index.prompts[0]] * 3 + [index.prompts[2]] * 3, FakeTrainer())
    finally:
        loop.run(rollouts.close(), 30)
        loop.stop()
    record = bridge.latest
    assert record.skipped and record.metrics["groups_used"] == 0 and record.metrics["refill_rounds"] == 2
    # 2 asked for, then 2 drawn per round: the 3 rows not tried yet first, then one tried again (fresh samples)
    assert record.metrics["groups_filtered"] == 6
    assert {g.row["id"] for g in record.groups.filtered} == {r["id"] for r in rows}
    right = sum(g.row["id"] == "r1" for g in record.groups.filtered)  # "1 + 1?" is answered right
    assert record.metrics["reward_mean"] == pytest.approx(right / 6) and record.metrics["completions"] == 0
    assert out["completion_ids"] == [[7]] * 6 and out["env_mask"] == [[0]] * 6 and out[REWARD_KEY] == [None] * 6
    assert scaffold([""] * 6, out[REWARD_KEY]) == [None] * 6  # TRL: unscorable, advantage 0


def test_loop_thread_bounds_every_wait():
    loop = LoopThread()
    try:
        with pytest.raises(TimeoutError, match="did not finish within 0.05 s"):
            loop.run(asyncio.sleep(5), 0.05)
        assert loop.run(asyncio.sleep(0, result=7), 5) == 7
    finally:
        loop.stop()
    assert loop.loop.is_closed() and not loop.thread.is_alive()


def test_trainer_options_are_validated_before_anything_loads():
    import scaffold_trl

    pset = plugin_set(test_tasks, scaffold_trl)
    base = {"task": {"name": "list", "rows": ROWS[:2]}}
    for trainer, message in (({"num_generations": 1}, r"trainer\.num_generations: .* or equal to 2; got 1"),
                             ({"prompts_per_step": 3, "micro_batch_size": 5}, "micro_batch_size must divide"),
                             ({"grpo": {"temperature": 0.5}}, "come from scaffold's config"),
                             ({"loss_type": "ppo"}, "trainer.loss_type")):
        with pytest.raises(Exception, match=message):
            load_config(data={**base, "trainer": {"name": "trl", **trainer}}, registry=pset.registry)
    config = load_config(data={**base, "trainer": {"name": "trl", "max_steps": 3}}, registry=pset.registry)
    assert config.trainer.options == {"max_steps": 3}


def test_example_configs_resolve():
    from scaffold_core.plugins import get_registry

    examples = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*trl*.yaml"))
    assert examples
    for path in examples:
        config = load_config(path, registry=get_registry())
        assert config.trainer is not None and config.trainer.name == "trl"


def test_trls_warning_about_scaffolds_padding_rows_is_dropped_and_any_other_kept(caplog):
    """A skipped step hands TRL padding rows without a reward on purpose: TRL's warning about them (which it may
    prefix with the rank) is dropped; the same warning about a real group's row still reaches the user."""
    import logging

    from scaffold_trl.grpo import quiet_padding

    quiet_padding()
    trl_log = logging.getLogger("trl.trainer.grpo_trainer")
    warning = "All reward functions returned None for the following kwargs:\n{{'scaffold_reward': None, " \
              "'scaffold_group': {group!r}, 'prompt': 'Name a color.'}}"
    with caplog.at_level(logging.WARNING, logger=trl_log.name):
        trl_log.warning("[RANK 0] " + warning.format(group=""))
        trl_log.warning(warning.format(group=""))
        trl_log.warning(warning.format(group="g7"))
    assert [r.getMessage() for r in caplog.records] == [warning.format(group="g7")]


def test_only_the_last_checkpoint_is_kept_by_default(tmp_path):
    """A checkpoint holds the optimizer's state (about three times the model): a short run keeps one, not one per
    save; trainer.save_total_limit keeps more, null all."""
    from types import SimpleNamespace

    from scaffold_trl.trainer import GRPORun, TRLTrainer

    def grpo_config(**options):
        run = SimpleNamespace(options=TRLTrainer(max_steps=3, save_steps=1, **options), device="cpu",
                              job=SimpleNamespace(output_dir=tmp_path),
                              config=SimpleNamespace(sampling=SimpleNamespace(max_tokens=8, temperature=1.0)))
        return GRPORun._grpo_config(run)

    assert grpo_config().save_total_limit == 1
    assert grpo_config(save_total_limit=3).save_total_limit == 3
    assert grpo_config(save_total_limit=None).save_total_limit is None


def test_trls_clip_ratio_completion_length_and_kl_are_kept_per_step():
    from types import SimpleNamespace

    from scaffold_trl.grpo import step_report

    logs = {"loss": 0.1, "clip_ratio/region_mean": 0.05, "completions/mean_length": 37.5, "kl": 0.01,
            "completions/clipped_ratio": 0.25, "learning_rate": 1e-5, "steps_skipped": 0, "groups_filtered": 2}
    step = step_report(logs, SimpleNamespace(global_step=3, max_steps=5), False)
    assert step.metrics["clip_ratio"] == 0.05 and step.metrics["completion_length"] == 37.5
    assert step.metrics["kl"] == 0.01 and step.metrics["completions_truncated"] == 0.25
    assert step.metrics["learning_rate"] == 1e-5 and step.metrics["groups_filtered"] == 2
