"""examples/gsm8k-calculator.yaml: it resolves, runs under `scaffold run` (Rollout) on the canned engine, and the
agent is token-faithful with SmolLM2's real tokenizer and model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import RecordingTokenizerEngine, check_token_by_token
from scaffold_testkit import make_contexts, run_episodes

from scaffold_core.config import load_config
from scaffold_core.output import read_records
from scaffold_core.plugins import get_plugins
from scaffold_core.run.rollout import Rollout

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gsm8k-calculator.yaml"
SMOL_ASSISTANT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def plugins():
    plugins = get_plugins()  # the installed plugins, as `scaffold run` sees them
    names = plugins.registry.names
    if "gsm8k_calculator" not in names("task") or "calculator" not in names("tool"):
        pytest.skip("needs scaffold-multiturn and scaffold-tools installed")
    return plugins


def build(plugins, config):
    reg = plugins.registry
    return (reg.create("task", config.task.name, config.task.options, path="task"),
            reg.create("controller", config.controller.name, config.controller.options, path="controller"),
            reg.create("verifier", config.verifier.name, config.verifier.options, path="verifier"),
            reg.create("trajectory_maker", config.trajectory.name, config.trajectory.options, path="trajectory"))


def test_example_is_small_offline_and_uses_the_calculator(plugins):
    config = load_config(EXAMPLE, registry=plugins.registry)
    assert (config.task.name, config.controller.name, config.trajectory.name) == (
        "gsm8k_calculator", "agent", "multiturn")
    assert config.engine.name == "transformers" and config.verifier.name == "gsm8k"
    assert config.task.options["source"] == "sample" and config.task.options["limit"] <= 8
    assert config.controller.options["tools"] == ["calculator"]
    _, controller, _, _ = build(plugins, config)
    assert list(controller.tools) == ["calculator"] and controller.format_name == "hermes"
    assert controller.max_turns == 4 and controller.max_total_tokens == 2048


def ledger(out: Path) -> list[dict]:
    return list(read_records(out))  # token arrays as lists, from the run's store


def test_example_shape_on_the_canned_engine(plugins, tmp_path):
    """The canned engine always calls the calculator: 3 tool turns, then the answer-now turn (its call not run)."""
    import datasets

    canned = json.dumps('Half of 48:\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}'
                        "\n</tool_call>")
    config = load_config(EXAMPLE, ["engine.name=benchmark_canned", f"engine.response={canned}", "task.limit=3",
                                   "controller.max_total_tokens=8192",  # the canned engine speaks in bytes
                                   "rollout.progress=false"], registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["completed"], metrics["failed"], metrics["turns"]) == (3, 0, 4.0)
    assert (metrics["tool_calls"], metrics["tool_errors"], metrics["tool_calls_skipped"]) == (3.0, 0.0, 1.0)
    assert metrics["forced_answer"] == 1.0 and metrics["drift"] == 0.0 and metrics["reward_mean"] == 0.0
    for episode in ledger(tmp_path / "run"):
        sample = episode["samples"][0]
        replies = [m["content"] for m in sample["metadata"]["messages"] if m["role"] == "user"]
        assert replies[:3] == ["<tool_response>\n24\n</tool_response>"] * 3
        assert replies[3].startswith("You have used up your budget for tool calls.")
        assert [c["name"] for c in sample["metadata"]["tool_calls"]] == ["calculator"] * 3
    trajectories = datasets.load_from_disk(str(tmp_path / "run" / "trajectories"))
    assert len(trajectories) == 3
    row = trajectories[0]
    assert len(row["turn_starts"]) == 4
    assert sum(row["loss_mask"]) == sum(e - s for s, e in zip(row["turn_starts"], row["turn_ends"]))


def test_smollm2_tokenizer_token_by_token(plugins, smollm2_engine):
    """Scripted calculator calls through SmolLM2's real tokenizer and chat template: exact ids, mask and drift 0,
    with turns that stop on <|im_end|> and one (with a call) cut by max_tokens."""
    config = load_config(EXAMPLE, ["task.limit=3", "sampling.max_tokens=60"], registry=plugins.registry)
    task, controller, verifier, maker = build(plugins, config)
    tok = smollm2_engine.tokenizer

    def respond(prompt, request):
        turn = prompt.count(SMOL_ASSISTANT) - 1
        if turn == 0:
            return ('First the half.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n'
                    "</tool_call>")
        if turn == 1:
            return ('<tool_call>{"name": "calculator", "arguments": {"expression": "24 * 2"}}</tool_call> and then '
                    + "a long stretch of reasoning that will not fit in the sixty tokens of this turn, " * 3)
        return "So the answer is 24.\n#### 24"

    engine = RecordingTokenizerEngine(tok, respond)
    contexts = make_contexts(task, tok, config.sampling.params())
    results = run_episodes(contexts, engine=engine, controller=controller, verifier=verifier, trajectory_maker=maker)
    for result in results:
        assert result.ok, result.error
        turns = result.samples[0].metadata["turns"]
        assert [t["finish_reason"] for t in turns] == ["stop", "length", "stop"]
        check_token_by_token(result, engine, tools=list(controller.tools.values()), task=task)


def test_example_on_the_real_model(plugins, smollm2_engine):
    """The example cut to 2 problems, 2 turns of 24 tokens, on the session's SmolLM2 engine."""
    config = load_config(EXAMPLE, ["task.limit=2", "sampling.max_tokens=24", "controller.max_turns=2"],
                         registry=plugins.registry)
    task, controller, verifier, maker = build(plugins, config)
    contexts = make_contexts(task, smollm2_engine.tokenizer, config.sampling.params())
    results = run_episodes(contexts, engine=smollm2_engine, controller=controller, verifier=verifier,
                           trajectory_maker=maker, timeout=600)
    assert len(results) == 2
    for result in results:
        assert result.ok, result.error
        assert result.metrics["drift"] == 0.0 and result.samples[0].reward in (0.0, 1.0)
        traj = result.trajectories[0]
        trained = [i for i, m in enumerate(traj.loss_mask) if m]
        assert 0 < len(trained) <= 48 and all(traj.logprobs[i] <= 0.0 for i in trained)
        assert all(traj.versions[i] == -1 and traj.logprobs[i] == 0.0
                   for i, m in enumerate(traj.loss_mask) if not m)


@pytest.mark.parametrize("isolation", ["none", "bubblewrap"])
def test_a_python_tool_without_kernel_isolation_is_in_the_metrics_and_the_summary(plugins, tmp_path, capsys,
                                                                                     isolation):
    """isolation: none warns at start, and the run's metrics and summary say so; the default jail is not named."""
    from scaffold_core.run.summary import print_summary

    if "python" not in plugins.registry.names("tool"):
        pytest.skip("needs scaffold-tools installed")
    canned = json.dumps('Let me compute:\n<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}'
                        "\n</tool_call>")
    tools = json.dumps([{"name": "python", "isolation": isolation}])
    config = load_config(EXAMPLE, ["engine.name=benchmark_canned", f"engine.response={canned}", "task.limit=1",
                                   f"controller.tools={tools}", "controller.max_turns=2",
                                   "controller.max_total_tokens=8192", "rollout.progress=false"],
                         registry=plugins.registry)
    try:
        metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    except Exception as exc:  # where bubblewrap cannot run, the default python tool refuses to start
        if isolation == "bubblewrap" and "bubblewrap" in str(exc):
            pytest.skip(str(exc))
        raise
    started = capsys.readouterr().err
    assert metrics["completed"] == 1 and metrics["tool_calls"] == 1.0 and metrics["tool_errors"] == 0.0
    [episode] = ledger(tmp_path / "run")
    assert episode["samples"][0]["metadata"]["tool_calls"][0]["metadata"]["isolation"] == isolation
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print_summary(metrics)
    summary = capsys.readouterr().err
    if isolation == "none":
        assert "isolation: none" in started and "WARNING" in started
        assert metrics["unisolated_tools"] == 1.0 and saved["unisolated_tools"] == 1.0
        assert episode["samples"][0]["metadata"]["unisolated_tools"] == ["python"]
        assert "without kernel isolation" in summary
    else:
        assert "unisolated_tools" not in saved and "without kernel isolation" not in started + summary
