"""The multiturn_chat controller through the real runtime: turns, rewards, environments, errors, isolation."""

from __future__ import annotations

import asyncio
import random
import re

import pytest
from mt_helpers import IdsEngine, assistant_turns, controller, registry, run
from scaffold_testkit import ListTask, ScriptedEngine

from scaffold_core import hookimpl
from scaffold_core.environment import Environment, EnvStep
from scaffold_core.errors import ConfigError
from scaffold_core.tokenizers import ByteTokenizer
from scaffold_multiturn.controller import MultiTurnChatController

ROWS = [{"id": f"q{i}", "question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(6)]


def right_on_turn(turn_for_row):
    """A scripted model that answers row ``i`` correctly on turn ``turn_for_row(i)`` (1-based), wrongly before."""

    def respond(prompt: str, request) -> str:
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[0])
        turn = assistant_turns(prompt)
        return str(a + b) if turn >= turn_for_row(a) else str(a + b + 100)

    return respond


def test_retries_until_right_and_discounts_the_reward_per_turn():
    engine = ScriptedEngine(right_on_turn(lambda i: i % 4 + 1))  # row i is right on turn i%4+1
    results = run(ListTask(ROWS), engine, controller(max_turns=3, turn_discount=0.5))
    for i, result in enumerate(results):
        assert result.ok, result.error
        sample = result.samples[0]
        right_on = i % 4 + 1
        turns = min(right_on, 3)
        assert result.metrics["turns"] == turns
        assert len(sample.metadata["turns"]) == turns
        expected = 0.5 ** (turns - 1) if right_on <= 3 else 0.0
        assert sample.reward == pytest.approx(expected)
        assert sample.turn_rewards == [0.0] * (turns - 1) + [1.0 if right_on <= 3 else 0.0]
        # the third turn is the last allowed: the verifier scores it, the environment is not asked
        assert sample.metadata["end"] == ("done" if right_on < 3 else "max_turns")
        assert result.metrics["max_turns_reached"] == float(right_on >= 3)
        assert result.trajectories[0].reward == pytest.approx(expected)
        assert result.trajectories[0].turn_rewards == sample.turn_rewards
        assert result.metrics["drift"] == 0.0


def test_environment_turns_are_masked_and_the_model_turns_are_exactly_what_was_sampled():
    engine = ScriptedEngine(right_on_turn(lambda i: 3))
    result = run(ListTask(ROWS[:1]), engine, controller(max_turns=3))[0]
    sample, traj = result.samples[0], result.trajectories[0]
    sampled = [r for r in engine.requests]
    assert len(sampled) == 3
    # every request's prompt is the sequence so far: each turn extends the previous turn's prompt
    for before, after in zip(sampled, sampled[1:]):
        assert after.prompt_ids[:len(before.prompt_ids)] == before.prompt_ids
    assert traj.input_ids == sample.prompt_ids + sample.output_ids
    assert traj.input_ids[:len(sampled[-1].prompt_ids)] == sampled[-1].prompt_ids
    tok = engine.tokenizer
    for start, end in zip(traj.turn_starts, traj.turn_ends):
        assert tok.decode(traj.input_ids[start:end]).endswith("<|end|>")
        assert traj.loss_mask[start:end] == [1] * (end - start)
    trained = [i for i, m in enumerate(traj.loss_mask) if m]
    assert trained == [i for s, e in zip(traj.turn_starts, traj.turn_ends) for i in range(s, e)]
    assert all(traj.logprobs[i] == 0.0 and traj.versions[i] == -1 for i, m in enumerate(traj.loss_mask) if not m)
    assert all(traj.logprobs[i] < 0 for i in trained)


def test_each_turn_keeps_its_results_logprobs_and_policy_version_and_a_cut_turn_is_closed():
    tok = ByteTokenizer()

    def respond(prompt_ids, request):
        turn = tok.decode(prompt_ids).count("<|assistant|>")
        if turn == 1:
            return tok.encode("It is 6 becau"), "length"  # cut: no end-of-turn token
        return tok.encode("5") + [tok.eos_token_id], "stop"

    engine = IdsEngine(respond)
    result = run(ListTask([{"id": "a", "question": "What is 2 + 3?", "answer": "5"}]), engine,
                 controller(max_turns=3))[0]
    assert result.ok and result.samples[0].reward == 1.0
    traj = result.trajectories[0]
    (first_req, first), (second_req, second) = engine.results
    assert second_req.prompt_ids == traj.input_ids[:traj.turn_starts[1]]
    for (start, end), res in zip(zip(traj.turn_starts, traj.turn_ends), (first, second)):
        assert traj.input_ids[start:end] == res.output_ids
        assert traj.logprobs[start:end] == res.logprobs
        assert traj.versions[start:end] == [res.weight_version] * (end - start)
    assert (first.weight_version, second.weight_version) == (0, 1)
    assert traj.input_ids[traj.turn_ends[0]] == tok.eos_token_id  # the cut turn closed by the environment turn
    assert traj.loss_mask[traj.turn_ends[0]] == 0
    assert result.samples[0].metadata["drift"]["kind"] is None


def test_samples_gives_independent_conversations_with_their_own_indices_and_seeds():
    engine = ScriptedEngine(right_on_turn(lambda i: 2))
    result = run(ListTask(ROWS[:2]), engine, controller(samples=3, max_turns=2))[0]
    assert result.ok
    assert [s.sample_index for s in result.samples] == [0, 1, 2]
    seeds = [r.seed for r in engine.requests if "What is 0 + 3?" in engine.tokenizer.decode(r.prompt_ids)]
    assert len(seeds) == 6 and len(set(seeds)) == 6
    assert result.metrics["turns"] == 2.0
    assert len(result.trajectories) == 3


def test_max_total_tokens_stops_the_conversation_before_it_outgrows_the_limit():
    engine = ScriptedEngine(lambda prompt, request: "wrong " * 5)
    task = ListTask(ROWS[:1])
    result = run(task, engine, controller(max_turns=10, max_total_tokens=150))[0]
    assert result.ok, result.error
    sample = result.samples[0]
    assert sample.metadata["end"] == "context"
    assert len(sample.prompt_ids) + len(sample.output_ids) <= 150
    assert result.metrics["turns"] < 10
    assert all(r.sampling.max_tokens <= 150 - len(r.prompt_ids) for r in engine.requests)


def test_a_prompt_already_past_max_total_tokens_fails_the_episode_clearly():
    result = run(ListTask(ROWS[:1]), ScriptedEngine("5"), controller(max_total_tokens=10))[0]
    assert result.status == "failed" and result.error_component == "task"
    assert "no fewer than controller.max_total_tokens (10)" in result.error


def test_a_missing_environment_is_a_config_error_listing_the_installed_ones():
    with pytest.raises(ConfigError, match="needs an environment.*verifier_feedback"):
        registry().create("controller", "multiturn_chat", {}, path="controller")
    with pytest.raises(ConfigError, match="unknown environment 'verifier_feedbak'.*Did you mean 'verifier_feedback'"):
        controller(environment="verifier_feedbak")


class Echo(Environment):
    """Replies with the turn number it counted in the state; done after ``n`` turns."""

    def __init__(self, n: int = 2):
        self.n = n

    def reset(self, ctx):
        return {"turn": 0}

    def step(self, state, response):
        state["turn"] += 1
        if state["turn"] >= self.n:
            return EnvStep.finish(reward=0.25, seen=state["turn"])
        return EnvStep.reply(f"turn {state['turn']} done", reward=0.1)


class AsyncEcho(Echo):
    async def step(self, state, response):
        await asyncio.sleep(0.001)
        return Echo.step(self, state, response)


class EnvPlugin:
    @hookimpl
    def register_environments(self, registry):
        registry.add("echo", Echo)
        registry.add("async_echo", AsyncEcho)
        registry.add("broken", lambda: BrokenEnv())
        registry.add("bad_reply", lambda: BadReply())
        registry.add("hangs", lambda: Hangs())
        registry.add("broken_reset", lambda: BrokenReset())
        registry.add("opaque_info", lambda: OpaqueInfo())


class BrokenEnv(Environment):
    def step(self, state, response):
        raise KeyError("no such tool")


class BrokenReset(Environment):
    def reset(self, ctx):
        raise ConnectionError("sandbox unreachable")

    def step(self, state, response):  # pragma: no cover - never reached
        return EnvStep.finish()


class BadReply(Environment):
    def step(self, state, response):
        return "try again"


class OpaqueInfo(Environment):
    def step(self, state, response):
        return EnvStep.finish(handle=object())


class Hangs(Environment):
    async def step(self, state, response):
        await asyncio.Event().wait()


@pytest.mark.parametrize("name", ["echo", "async_echo"])
def test_third_party_environments_plain_and_async(name):
    reg = registry(EnvPlugin())
    result = run(ListTask(ROWS[:2]), ScriptedEngine("41"), controller(reg, environment={"name": name, "n": 3},
                                                                       max_turns=5))[0]
    assert result.ok, result.error
    sample = result.samples[0]
    assert sample.turn_rewards == [0.1, 0.1, 0.25]
    assert sample.metadata["environment_info"][-1] == {"seen": 3}
    assert [m["content"] for m in sample.metadata["messages"] if m["role"] == "user"] == ["turn 1 done", "turn 2 done"]
    assert sample.reward == 0.0  # '41' is not the answer: the final reward comes from the verifier


@pytest.mark.parametrize("name, match", [
    ("broken", "environment 'broken' raised KeyError"),
    ("broken_reset", "environment 'broken_reset' raised ConnectionError in reset: sandbox unreachable"),
    ("bad_reply", "returned str from step\\(\\); return an EnvStep"),
    ("opaque_info", "returned info that is not JSON-serialisable"),
    ("hangs", "environment 'hangs' step did not finish within 0.2 s"),
])
def test_environment_failures_fail_the_episode_with_the_reason(name, match):
    reg = registry(EnvPlugin())
    ctrl = controller(reg, environment=name, environment_timeout=0.2)
    for result in run(ListTask(ROWS[:2]), ScriptedEngine("41"), ctrl, timeout=30):
        assert result.status == "failed"
        assert result.error_component == "environment"
        assert re.search(match, result.error), result.error


def test_engine_failure_on_a_later_turn_fails_the_episode():
    engine = ScriptedEngine("41", fail=lambda prompt: assistant_turns(prompt) == 2)
    result = run(ListTask(ROWS[:1]), engine, controller(max_turns=3))[0]
    assert result.status == "failed" and result.error_component == "engine"


def test_the_reply_after_a_wrong_answer_never_holds_the_reference():
    reg = registry()
    task = reg.create("task", "multiturn_gsm8k", {"source": "sample"})
    options = {k: v for k, v in task.default_config["controller"].items() if k != "name"}
    verifier = reg.create("verifier", "gsm8k", {})
    engine = ScriptedEngine(lambda prompt, request: "I think it is\n#### 100000" if assistant_turns(
        prompt, "<|assistant|>") == 1 else "No idea.")
    results = run(task, engine, controller(reg, **options), verifier=verifier)
    assert len(results) == 32
    for result in results:
        assert result.ok, result.error
        replies = [m["content"] for m in result.samples[0].metadata["messages"] if m["role"] == "user"]
        assert len(replies) == 2
        assert "100000 is not correct" in replies[0] and "could not find your final answer" in replies[1]
        gold = result.reference
        for reply in replies:
            assert not re.search(rf"(?<![\d.]){re.escape(gold)}(?![\d.])", reply), (gold, reply)
        assert result.samples[0].reward == 0.0


def test_500_concurrent_episodes_with_random_delays_share_no_state():
    """Each episode's question names it; the model echoes the tag it sees, the environment counts turns in its
    state and ends on a per-episode schedule. Any state leaking between episodes shows up as a wrong tag,
    a wrong turn count or a sequence that is not its own conversation."""

    class TagEnv(Environment):
        def reset(self, ctx):
            return {"tag": ctx.row["tag"], "turn": 0, "stop_at": ctx.row["stop_at"]}

        def step(self, state, response):
            state["turn"] += 1
            assert f"tag={state['tag']}" in response, (state, response)  # the model answered this episode
            if state["turn"] >= state["stop_at"]:
                return EnvStep.finish(reward=float(state["turn"]))
            return EnvStep.reply(f"next for tag={state['tag']} after turn {state['turn']}")

    def respond(prompt: str, request) -> str:
        tags = re.findall(r"tag=(\d+)", prompt)
        assert len(set(tags)) == 1, "a prompt mixes two episodes"
        return f"tag={tags[0]} turn={assistant_turns(prompt)}"

    n = 500
    rng = random.Random(5)
    rows = [{"id": f"e{i}", "question": f"Episode tag={i}.", "answer": "x", "tag": i, "stop_at": rng.randint(1, 4)}
            for i in range(n)]
    engine = ScriptedEngine(respond, delay=(0.0, 0.01), seed=11)
    ctrl = MultiTurnChatController(environment=TagEnv(), max_turns=5)  # an environment object, from Python
    results = run(ListTask(rows), engine, ctrl, concurrency=n, timeout=300)
    tok = ByteTokenizer()
    assert len(results) == n
    for row, result in zip(rows, results):
        assert result.ok, result.error
        sample = result.samples[0]
        turns = row["stop_at"]
        assert result.metrics["turns"] == turns
        assert sample.turn_rewards[-1] == float(turns)
        text = tok.decode(sample.prompt_ids + sample.output_ids)
        assert set(re.findall(r"tag=(\d+)", text)) == {str(row["tag"])}
        assert [f"turn={t}" in text for t in range(1, turns + 1)] == [True] * turns
        assert result.metrics["drift"] == 0.0
        traj = result.trajectories[0]
        assert traj.input_ids == sample.prompt_ids + sample.output_ids and len(traj.turn_starts) == turns


class CountingEnv(Environment):
    """Keeps per-conversation state only in what reset() returns; holds a lock (cannot be copied)."""

    def __init__(self):
        import threading

        self.lock = threading.Lock()

    def reset(self, ctx):
        return {"turn": 0}

    def step(self, state, response):
        state["turn"] += 1
        return EnvStep.reply("again") if state["turn"] < 2 else EnvStep.finish(reward=1.0)


def test_clones_share_the_environment_and_copy_everything_else():
    ctrl = MultiTurnChatController(environment=CountingEnv(), max_turns=3)
    twin = ctrl.clone()
    assert "clone" not in vars(MultiTurnChatController)  # isolation comes from the base class's rules
    assert twin is not ctrl and twin.environment is ctrl.environment  # declared in `shared`
    ctrl.notes = {"seen": []}  # a user adds mutable state: clones get their own
    assert ctrl.clone().notes is not ctrl.notes
    results = run(ListTask(ROWS[:3]), ScriptedEngine("3"), ctrl)
    assert all(r.ok for r in results) and [r.metrics["turns"] for r in results] == [2.0] * 3  # finish on turn 2


def test_the_multiturn_maker_normalises_like_grpo_and_drops_unscored_conversations():
    from scaffold_core.episode import EpisodeResult, Sample
    from scaffold_core.trajectory import MissingRewardError, group_normalized
    from scaffold_core.verifier import Verdict
    from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker

    def episode(rewards):
        samples = [Sample([1, 2], [3, 4], [-0.5, -0.5], [1, 1], "x", "stop", sample_index=i,
                          verdict=None if r is None else Verdict(r)) for i, r in enumerate(rewards)]
        return EpisodeResult(episode_id="m", index=0, status="ok", samples=samples)

    made = MultiTurnTrajectoryMaker(advantage="grpo").make(episode([1.0, 0.0, 0.0, 1.0]))
    a = 0.5 / (3 ** -0.5 + 1e-5)  # unbiased std and eps 1e-5 by default, as the grpo maker
    assert [t.advantage for t in made] == pytest.approx([a, -a, -a, a])
    assert [t.advantage for t in made] == pytest.approx(group_normalized([1.0, 0.0, 0.0, 1.0]))
    rloo = MultiTurnTrajectoryMaker(advantage="grpo", baseline="leave_one_out", std="none")
    assert [t.advantage for t in rloo.make(episode([1.0, 0.0, 0.0]))] == pytest.approx([1.0, -0.5, -0.5])
    kept = MultiTurnTrajectoryMaker(advantage="grpo").make(episode([1.0, None, 1.0]))
    assert [t.sample_index for t in kept] == [0, 2] and [t.advantage for t in kept] == [0.0, 0.0]
    assert [t.reward for t in MultiTurnTrajectoryMaker().make(episode([0.0, None]))] == [0.0]  # 0.0 stays
    with pytest.raises(MissingRewardError, match="sample 1 of episode m has no reward"):
        MultiTurnTrajectoryMaker(missing_reward="fail").make(episode([1.0, None]))
    with pytest.raises(ValueError, match="std must be"):
        MultiTurnTrajectoryMaker(std="sample")
