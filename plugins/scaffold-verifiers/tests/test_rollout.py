"""Multi-turn, tool and judge environments (tests/envs, written against the verifiers.v1 API) played by the
library's own rollout under `scaffold run`, on a scripted engine: token-faithful trajectories (drift 0, every
tool and user turn kept, masked, version -1), rewards equal to the library's own scoring of the same
completions, judges on the same endpoint (never trained on) or a configured one."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

vf = pytest.importorskip("verifiers.v1")
datasets = pytest.importorskip("datasets")

import scaffold_verifiers  # noqa: E402
from scaffold_testkit import BackgroundLoop, ScriptedEngine, plugin_set  # noqa: E402
from scaffold_verifiers.environment import check_rollout, load  # noqa: E402
from scaffold_verifiers.program import run_chat_program_here  # noqa: E402

import scaffold_multiturn  # noqa: E402
import scaffold_serve  # noqa: E402
from scaffold_core import hookimpl  # noqa: E402
from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.output import read_records  # noqa: E402
from scaffold_core.run.rollout import Rollout  # noqa: E402
from scaffold_core.tokenizers import ByteTokenizer  # noqa: E402

JUDGE_PROMPT = "determine if the response is correct"


def last_message(prompt: str) -> str:
    """The last message of a ByteTokenizer chat prompt (before the assistant header)."""
    body = prompt[: prompt.rfind("<|assistant|>")]
    return body[body.rfind("<|", 0, len(body) - len("<|end|>\n")):]


def calc_reply(prompt: str, request: Any) -> str:
    """Calls the calculator for the question, then reports the tool's result."""
    last = last_message(prompt)
    if "<tool_response>" in last:
        return "The answer is " + last.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
    a, b = re.search(r"What is (\d+) \+ (\d+)", last).groups()  # type: ignore[union-attr]
    return f'<tool_call>\n{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


def quiz_reply(prompt: str, request: Any) -> str:
    """Judges say yes; challenged, the model answers with the city only; first, it answers in a sentence."""
    if JUDGE_PROMPT in prompt:
        return "yes"
    city = "Paris" if "France" in prompt else "Tokyo"
    return city if "Are you sure?" in last_message(prompt) else f"It is {city}, I believe."


class Engines:
    @hookimpl
    def register_engines(self, registry):
        registry.add("scripted_calc", lambda: ScriptedEngine(calc_reply))
        registry.add("scripted_quiz", lambda: ScriptedEngine(quiz_reply))


@pytest.fixture(scope="module")
def pset():
    return plugin_set(scaffold_multiturn, scaffold_serve, scaffold_verifiers, Engines())


def scaffold_run(pset, out, env: str, engine: str, **task: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    controller = task.pop("controller", None)
    config = load_config(data={
        "task": {"name": "verifiers", "env": env, **task}, "engine": {"name": engine},
        "sampling": {"max_tokens": 128}, "trajectory": {"name": "multiturn"},
        **({"controller": controller} if controller else {}),
    }, registry=pset.registry)
    assert config.controller.name == "verifiers_rollout"  # the task's default
    metrics = Rollout(config, output_dir=out, plugins=pset, progress=False).run()
    episodes = {e["episode_id"]: e for e in read_records(out)}
    return metrics, episodes, out


def trajectories(out) -> dict[str, Any]:
    return {row["episode_id"]: row for row in datasets.load_from_disk(str(out / "trajectories"))}


def split_tokens(row: dict[str, Any]) -> tuple[str, str]:
    """(the text of the tokens trained on, the text of the rest) of a trajectory row."""
    tokenizer = ByteTokenizer()
    trained = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
    masked = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if not m])
    return trained, masked


def check_token_faithful(row: dict[str, Any]) -> None:
    """Model tokens: mask 1, the engine's version (0) and logprobs; everything else: mask 0, version -1."""
    assert all(v == 0 and lp < 0 for v, lp, m in zip(row["versions"], row["logprobs"], row["loss_mask"]) if m)
    assert all(v == -1 for v, m in zip(row["versions"], row["loss_mask"]) if not m)


def library_rescore(env: str, index: int, turns: list[dict[str, Any]]) -> Any:
    """The library scoring, on its own, a transcript of the completions scaffold recorded (`turns`: the
    client-side messages after the prompt), exactly as vf-replay scores a recorded trace."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    task = list(load_taskset(taskset_config_type(env).model_validate({"id": env})))[index]
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig()))
    messages = [vf.UserMessage(content=task.data.prompt), *turns]
    for i, message in enumerate(messages):
        trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message,
                                       sampled=message.role == "assistant"))
    asyncio.run(task.score(trace))
    return trace


def test_a_tool_environment_runs_its_own_loop_and_every_tool_turn_is_kept(pset, tmp_path):
    metrics, episodes, out = scaffold_run(pset, tmp_path / "run", "scaffold_vf_calc", "scripted_calc")
    assert (metrics["completed"], metrics["failed"]) == (2, 0), episodes
    assert metrics["drift"] == 0.0 and metrics["agent_calls"] == 2.0 and metrics["traces"] == 1.0
    rows = trajectories(out)
    for index, (episode_id, a, b) in enumerate((("add-2-3", 2, 3), ("add-20-22", 20, 22))):
        sample = episodes[episode_id]["samples"][0]
        trained, masked = split_tokens(rows[episode_id])
        call = f'<tool_call>\n{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        assert call in trained and f"The answer is {a + b}" in trained  # both model turns, as sampled
        assert f"<tool_response>\n{a + b}\n</tool_response>" in masked  # the MCP server's result, not trained on
        assert "calc_add" in masked.split("<|user|>")[0]  # the harness described the server's tool to the model
        check_token_faithful(rows[episode_id])
        assert len(rows[episode_id]["turn_starts"]) == 2
        # the library, scoring the same completions on its own, gives the same reward and per-function values
        theirs = library_rescore("scaffold_vf_calc", index, [
            vf.AssistantMessage(content=None, tool_calls=[vf.ToolCall(id="c1", name="calc_add",
                                                                       arguments=json.dumps({"a": a, "b": b}))]),
            vf.ToolMessage(tool_call_id="c1", content=str(a + b)),
            vf.AssistantMessage(content=sample["response"])])
        assert sample["response"] == f"The answer is {a + b}"
        assert sample["reward"] == pytest.approx(theirs.reward) == 1.5
        expected = {f"reward/{k}": r.score for k, r in theirs.rewards.items()}
        assert sample["verdict_metrics"] == pytest.approx({**expected, "metric/turns": 2.0})


def library_run(env: str, url: str, env_args: dict[str, Any], limit: int) -> list[Any]:
    """The library running the environment's first ``limit`` episodes itself (Env.run_episode, its own scoring)
    against a plain OpenAI endpoint at ``url``: the traces it produces."""
    from verifiers.v1.utils.loaders import load_environment

    run_chat_program_here()
    loaded = load(env, env_args)
    environment = load_environment(check_rollout(loaded, "null", None))
    context = vf.ModelContext(model="scaffold", client=vf.EvalClientConfig(base_url=url,
                                                                            api_key_var="SCAFFOLD_TEST_NO_KEY"))

    async def run() -> list[Any]:
        async with environment.serving():
            episodes = [await environment.run_episode(task, context) for task in environment.taskset.take(limit)]
        return [trace for episode in episodes for trace in episode.traces]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def quiz_server():
    """A scaffold serve endpoint (no sessions needed) over the quiz's scripted engine: the library's own runs,
    and a configured judge endpoint, use it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(scaffold_serve.__file__).resolve().parents[1] / "tests"))
    from serve_helpers import LiveServer

    loop = BackgroundLoop("vf-quiz-server")
    server = LiveServer(ScriptedEngine(quiz_reply), loop=loop)
    try:
        yield server
    finally:
        server.close()
        loop.close()


def test_a_multi_turn_environment_with_a_judge_scores_as_the_library_does(pset, tmp_path, quiz_server):
    metrics, episodes, out = scaffold_run(pset, tmp_path / "run", "scaffold_vf_quiz", "scripted_quiz", limit=1)
    assert (metrics["completed"], metrics["failed"]) == (1, 0), episodes
    assert metrics["drift"] == 0.0 and metrics["agent_calls"] == 2.0 and metrics["judge_calls"] == 1.0
    rows = trajectories(out)
    url = f"{quiz_server.url}/v1"  # the library's own run: its agent and its judge on the same scripted engine
    judges = {"task": {"judges": [{"id": "reference", "base_url": url, "model": "scaffold",
                                   "api_key_var": "SCAFFOLD_TEST_NO_KEY"}]}}
    theirs = {trace.task.data.id: trace for trace in library_run("scaffold_vf_quiz", url, judges, limit=1)}
    for episode_id, city in (("france", "Paris"),):
        episode = episodes[episode_id]
        assert len(episode["samples"]) == 1  # the judge's conversation is not a sample
        sample = episode["samples"][0]
        trained, masked = split_tokens(rows[episode_id])
        assert f"It is {city}, I believe." in trained and trained.endswith(f"{city}<|end|>")
        assert "Are you sure? Answer again, with the city only." in masked  # the environment's user turn
        assert JUDGE_PROMPT not in trained + masked
        check_token_faithful(rows[episode_id])
        library = theirs[episode_id]
        assert sample["response"] == library.last_reply == city
        assert sample["reward"] == pytest.approx(library.reward) == 1.5
        expected = {f"reward/{k}": r.score for k, r in library.rewards.items()}
        expected.update({f"metric/{k}": v for k, v in library.metrics.items()})
        assert sample["verdict_metrics"] == pytest.approx(expected)
        assert expected["reward/reference"] == 1.0 and expected["metric/user_turns"] == 2.0


def test_a_configured_judge_endpoint_gets_the_judge_calls(pset, tmp_path, quiz_server, monkeypatch):
    monkeypatch.setenv("SCAFFOLD_TEST_JUDGE_KEY", "unused")
    before = len(quiz_server.engine.requests)
    judge = {"base_url": f"{quiz_server.url}/v1", "model": "scaffold", "api_key_var": "SCAFFOLD_TEST_JUDGE_KEY"}
    metrics, episodes, _ = scaffold_run(pset, tmp_path / "run", "scaffold_vf_quiz", "scripted_quiz", limit=1,
                                        controller={"name": "verifiers_rollout", "judge": judge})
    assert metrics["failed"] == 0 and metrics["judge_calls"] == 0.0  # nothing through the run's own engine
    judged = [r for r in quiz_server.engine.requests[before:]
              if JUDGE_PROMPT in quiz_server.engine.tokenizer.decode(r.prompt_ids)]
    assert len(judged) == 1 and episodes["france"]["samples"][0]["verdict_metrics"]["reward/reference"] == 1.0


def test_each_conversation_is_scored_by_the_agent_run_that_made_it():
    """An episode of several agent runs (the library names each in its calls' X-Session-ID): each conversation of
    the session is one sample rewarded by its own trace; an untrainable seat's run (a judge agent) and a retried
    attempt's calls give no sample; the episode's answer is the last trainable run's."""
    from types import SimpleNamespace

    from scaffold_verifiers.rollout import _outcome

    from scaffold_core.generation import GenerationResult
    from scaffold_multiturn.tool_formats import HermesFormat
    from scaffold_serve.session import Session
    from scaffold_serve.wire import parse_chat_request

    tokenizer = ByteTokenizer()
    session = Session("s", tokenizer, HermesFormat())
    traces = []
    for name, text, reward, trainable in (("solver", "first", 0.25, True), ("judge", "verdict", 1.0, False),
                                          ("solver", "second", 0.75, True)):
        trace = vf.Trace(task=vf.TraceTask(type="Task", data=vf.TaskData(prompt="p")),
                         agent=vf.AgentInfo(config=vf.AgentConfig(), name=name, trainable=trainable))
        trace.record_reward("score", reward, 1.0)
        traces.append(trace)
        ask = parse_chat_request({"model": "scaffold", "messages": [{"role": "user", "content": f"go {text}"}]})
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        session.commit(session.plan(ask), [GenerationResult(ids, [-0.5] * len(ids), "stop", text, 0)], ask,
                       tag=trace.id)
    retried = parse_chat_request({"model": "scaffold", "messages": [{"role": "user", "content": "a retried try"}]})
    ids = tokenizer.encode("lost") + [tokenizer.eos_token_id]
    session.commit(session.plan(retried), [GenerationResult(ids, [-0.5] * len(ids), "stop", "lost", 0)], retried,
                   tag="an-abandoned-attempt")
    played = SimpleNamespace(traces=traces)
    outcome = _outcome(SimpleNamespace(session=session, side=[]), played, SimpleNamespace(sample_base=0), "env", 1.0)
    assert [s.verdict.reward for s in outcome.samples] == [0.25, 0.75]
    assert [s.metadata["trace"] for s in outcome.samples] == [traces[0].id, traces[2].id]
    assert outcome.samples[1].verdict.metrics == {"reward/score": 0.75}
    assert outcome.chosen == 1 and outcome.answer_reward == 0.75
    assert outcome.metrics["skipped_trajectories"] == 2.0 and outcome.metrics["traces"] == 3.0
