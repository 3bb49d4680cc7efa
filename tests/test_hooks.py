"""Every hook, exercised the way a plugin uses it (datasette style: one ``test_hook_<name>`` per hookspec).

``test_every_hookspec_has_a_test`` fails when a hookspec is added without a test of its own here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import scaffold_testkit.plugin as test_tasks
from scaffold_testkit import plugin_set

from scaffold_core import hookimpl
from scaffold_core.config import load_config
from scaffold_core.plugins import hookspecs
from scaffold_core.run.rollout import Rollout

HOOKS = sorted(name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "scaffold_spec"))
ROWS = [{"id": "a", "question": "What is 1 + 1?", "answer": "2"},
        {"id": "b", "question": "What is 2 + 2?", "answer": "4"}]


def run_with(tmp_path: Path, *plugins: object, **sections: dict) -> tuple[dict, Path]:
    data = {"task": {"name": "list", "rows": ROWS}, "engine": {"name": "benchmark_canned", "response": "2"},
            "output": {"save_dataset": False}, **sections}
    pset = plugin_set(test_tasks, *plugins)
    config = load_config(data=data, registry=pset.registry)
    out = tmp_path / "run"
    return Rollout(config, output_dir=out, plugins=pset, progress=False).run(), out


def test_every_hookspec_has_a_test():
    tests = {name for name in globals() if name.startswith("test_hook_")}
    missing = [hook for hook in HOOKS if f"test_hook_{hook}" not in tests]
    assert not missing, f"hookspecs without a test_hook_<name> in tests/test_hooks.py: {missing}"


class Registers:
    """A plugin adding one component of each kind under its own name."""

    @hookimpl
    def register_tasks(self, registry):
        registry.add("hook_task", test_tasks.ConfiguredListTask)

    @hookimpl
    def register_controllers(self, registry):
        from scaffold_core.builtins.controllers import NativeController

        class TwiceController(NativeController):
            """Two samples per episode."""

            def __init__(self):
                super().__init__(samples=2)

        registry.add("hook_twice", TwiceController)

    @hookimpl
    def register_verifiers(self, registry):
        from scaffold_core.verifier import Verdict

        class AlwaysHalf:
            """Half a reward for anything."""

            def verify(self, response, reference):
                return Verdict(0.5, response.strip(), None, "half")

        registry.add("hook_half", AlwaysHalf)

    @hookimpl
    def register_engines(self, registry):
        from scaffold_core.engines.canned import CannedBenchmarkEngine

        registry.add("hook_engine", lambda response="4": CannedBenchmarkEngine(response=response))

    @hookimpl
    def register_trajectory_makers(self, registry):
        from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker
        from scaffold_core.trajectory import TrainingSample

        class Doubled(SingleTurnTrajectoryMaker):
            """Advantage = 2 * reward."""

            def make(self, episode) -> list[TrainingSample]:
                out = super().make(episode)
                for sample in out:
                    sample.advantage = 2 * sample.reward
                return out

        registry.add("hook_doubled", Doubled)

    @hookimpl
    def register_environments(self, registry):
        registry.add("hook_env", lambda greeting="hi": {"greeting": greeting})


def registered_run(tmp_path: Path) -> tuple[dict, Path]:
    return run_with(tmp_path, Registers(), task={"name": "hook_task", "rows": ROWS},
                    controller={"name": "hook_twice"}, verifier={"name": "hook_half"},
                    engine={"name": "hook_engine", "response": "4"}, trajectory={"name": "hook_doubled"})


def records(out: Path) -> list[dict]:
    from scaffold_core.output import read_records

    return list(read_records(out))


def test_hook_register_tasks(tmp_path):
    metrics, out = registered_run(tmp_path)
    assert metrics["episodes"] == 2 and {r["episode_id"] for r in records(out)} == {"a", "b"}


def test_hook_register_controllers(tmp_path):
    _, out = registered_run(tmp_path)
    assert all(len(r["samples"]) == 2 for r in records(out))


def test_hook_register_verifiers(tmp_path):
    metrics, _ = registered_run(tmp_path)
    assert metrics["reward_mean"] == 0.5


def test_hook_register_engines(tmp_path):
    _, out = registered_run(tmp_path)
    assert {s["response"] for r in records(out) for s in r["samples"]} == {"4"}


def test_hook_register_trajectory_makers(tmp_path):
    _, out = registered_run(tmp_path)
    assert {t["advantage"] for r in records(out) for t in r["trajectories"]} == {1.0}


def test_hook_register_environments():
    pset = plugin_set(Registers())
    assert pset.registry.create("environment", "hook_env", {"greeting": "hello"}) == {"greeting": "hello"}
    assert "hook_env" in pset.registry.names("environment")


class Lifecycle:
    def __init__(self):
        self.calls: list[tuple] = []

    @hookimpl
    def on_run_start(self, config, output_dir):
        self.calls.append(("start", config.task.name, output_dir))

    @hookimpl
    def on_episode_end(self, result):
        self.calls.append(("episode", result.episode_id, result.status))

    @hookimpl
    def on_run_end(self, metrics, output_dir):
        self.calls.append(("end", metrics["episodes"], output_dir,
                           (Path(output_dir) / "samples.jsonl").exists()))


def test_hook_on_run_start(tmp_path):
    probe = Lifecycle()
    _, out = run_with(tmp_path, probe)
    assert probe.calls[0] == ("start", "list", str(out))


def test_hook_on_episode_end(tmp_path):
    probe = Lifecycle()
    run_with(tmp_path, probe)
    assert sorted(c[1:] for c in probe.calls if c[0] == "episode") == [("a", "ok"), ("b", "ok")]


def test_hook_on_run_end(tmp_path):
    probe = Lifecycle()
    metrics, out = run_with(tmp_path, probe)
    # Once, last, after the derived files are written, with the metrics that metrics.json holds.
    assert probe.calls[-1] == ("end", 2, str(out), True)
    assert [c[0] for c in probe.calls].count("end") == 1
    assert json.loads((out / "metrics.json").read_text())["episodes"] == metrics["episodes"] == 2


def test_hook_on_run_end_error_is_counted_not_fatal(tmp_path, caplog):
    class Broken:
        @hookimpl
        def on_run_end(self, metrics, output_dir):
            raise RuntimeError("boom")

    probe = Lifecycle()
    metrics, out = run_with(tmp_path, Broken(), probe)
    assert metrics["episodes"] == 2 and probe.calls[-1][0] == "end"
    assert "raised in on_run_end" in caplog.text
    assert list(metrics["hook_errors"].values()) == [1]
    assert json.loads((out / "metrics.json").read_text())["hook_errors"] == metrics["hook_errors"]


class Tracer:
    def __init__(self):
        self.seen: list[tuple[str, str, int]] = []

    @hookimpl(wrapper=True)
    def engine_request(self, request, engine):
        result = yield
        self.seen.append((request.episode_id, engine, len(result.output_ids)))
        return result


def test_hook_engine_request(tmp_path):
    tracer = Tracer()
    run_with(tmp_path, tracer)
    assert sorted(e for e, _, _ in tracer.seen) == ["a", "b"]
    assert {name for _, name, _ in tracer.seen} == {"benchmark_canned"}
    assert all(n == 2 for _, _, n in tracer.seen)  # "2" and EOS


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_is_documented_where_defined(hook):
    assert (getattr(hookspecs, hook).__doc__ or "").strip(), f"hookspec {hook} has no docstring"


class Tools:
    @hookimpl
    def register_tools(self, registry):
        from scaffold_core.tool import Tool, ToolResult

        class Echo(Tool):
            """Echo the text back."""

            name = "echo"
            description = "Echo the text back."
            parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

            def __init__(self, prefix: str = ""):
                self.prefix = prefix

            async def call(self, arguments, context):
                return ToolResult(self.prefix + arguments["text"])

        registry.add("echo", Echo)


def test_hook_register_tools():
    import asyncio

    from scaffold_core.tool import ToolContext, invoke_tool

    pset = plugin_set(Tools())
    tool = pset.registry.create("tool", "echo", {"prefix": "> "})
    context = ToolContext(episode_id="e", call_id="c", state={})
    assert asyncio.run(invoke_tool(tool, {"text": "hi"}, context)).content == "> hi"
    bad = asyncio.run(invoke_tool(tool, {"txt": "hi"}, context))
    assert not bad.ok and bad.error == "bad_arguments"


class ToolFormats:
    @hookimpl
    def register_tool_formats(self, registry):
        from scaffold_core.tool_format import ToolCall, ToolFormat, ToolPrompt, result_text

        class Lines(ToolFormat):
            """Calls as `CALL name {json}` lines; results as `RESULT:` user messages."""

            name = "lines"

            def __init__(self, marker: str = "CALL"):
                self.marker = marker

            def prompt(self, messages, tools, tokenizer):
                names = ", ".join(tool.name for tool in tools)
                return ToolPrompt([{"role": "system", "content": f"Tools: {names}"}, *messages])

            def parse(self, text):
                calls = []
                for i, line in enumerate(text.splitlines()):
                    if line.startswith(self.marker + " "):
                        name, _, args = line[len(self.marker) + 1:].partition(" ")
                        calls.append(ToolCall(name, args, id=f"call_{i}", text=line))
                return calls

            def result_messages(self, calls, results):
                return [{"role": "user", "content": "\n".join(f"RESULT: {result_text(r)}" for r in results)}]

        registry.add("lines", Lines)


def test_hook_register_tool_formats():
    import asyncio

    from scaffold_core.tool import ToolContext
    from scaffold_core.tool_format import run_tool_call

    pset = plugin_set(Tools(), ToolFormats())
    assert "lines" in pset.registry.names("tool_format")
    fmt = pset.registry.create("tool_format", "lines", {"marker": "DO"})
    echo = pset.registry.create("tool", "echo", {})
    prompt = fmt.prompt([{"role": "user", "content": "hi"}], [echo], tokenizer=None)
    assert prompt.messages[0] == {"role": "system", "content": "Tools: echo"}
    calls = fmt.parse('thinking\nDO echo {"text": "a"}\nDO nope {}\nDO echo {"text": 1}')
    assert [c.name for c in calls] == ["echo", "nope", "echo"]
    context = ToolContext(episode_id="e", call_id="c")
    results = [asyncio.run(run_tool_call(c, {"echo": echo}, context)) for c in calls]
    assert [(r.ok, r.error) for r in results] == [(True, None), (False, "unknown_tool"), (False, "bad_arguments")]
    rendered = fmt.result_messages(calls, results)[0]["content"].splitlines()
    assert rendered[0] == "RESULT: a" and rendered[1].startswith("RESULT: Error (unknown_tool): unknown tool 'nope'")


class Trainers:
    """A trainer plugin in a few lines: each step runs one group per row and reports its mean reward."""

    @hookimpl
    def register_trainers(self, registry):
        import asyncio

        from scaffold_core.train.prompt_groups import TrainingRollouts
        from scaffold_core.trainer import Trainer, TrainStep

        class MeanReward(Trainer):
            def __init__(self, steps: int = 2, group: int = 2):
                self.steps, self.group = steps, group

            def train(self, job):
                async def loop():
                    async with TrainingRollouts.from_config(job.config, registry=job.registry) as rollouts:
                        for step in range(1, self.steps + 1):
                            groups = await rollouts.run_groups(rollouts.rows(), samples=self.group)
                            rewards = [r for g in groups for r in g.rewards]
                            job.report(TrainStep(step, self.steps, {
                                "reward_mean": sum(rewards) / len(rewards), "loss": 0.0,
                                "version": rollouts.weight_version, "stale_dropped": rollouts.stats.stale_dropped,
                                "samples": len(rewards)}))
                        return rollouts.stats.to_dict()

                return asyncio.run(loop())

        registry.add("mean_reward", MeanReward)


def test_hook_register_trainers(tmp_path):
    import io

    from scaffold_core.train.session import run_training

    pset = plugin_set(test_tasks, Trainers())
    data = {"task": {"name": "list", "rows": ROWS}, "engine": {"name": "benchmark_canned", "response": "2"},
            "trainer": {"name": "mean_reward", "steps": 3, "group": 4}}
    config = load_config(data=data, registry=pset.registry)
    assert config.trainer.name == "mean_reward" and config.to_dict()["trainer"]["steps"] == 3
    out = tmp_path / "train"
    stream = io.StringIO()
    summary = run_training(config, out, registry=pset.registry, progress=False, stream=stream)
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["reward_mean"] == 0.5 and s["samples"] == 8 for s in steps)  # "2" is right for row a only
    assert summary["groups"] == 6 and summary["samples"] == 24 and summary["steps"] == 3
    assert json.loads((out / "train_summary.json").read_text())["samples"] == 24
    assert "step 3/3  reward_mean=0.5  loss=0  version=0  stale_dropped=0" in stream.getvalue()
    assert "trainer:" in (out / "config.yaml").read_text()


# -- what docs/hooks.md promises about errors ------------------------------------------------


def test_lifecycle_hook_errors_are_counted_and_other_plugins_still_called(tmp_path, caplog):
    class Raises:
        @hookimpl
        def on_run_start(self, config, output_dir):
            raise RuntimeError("start")

        @hookimpl
        def on_episode_end(self, result):
            raise RuntimeError("episode")

    probe = Lifecycle()
    metrics, out = run_with(tmp_path, Raises(), probe)
    assert metrics["completed"] == 2  # the run goes on
    assert sorted(c[0] for c in probe.calls) == ["end", "episode", "episode", "start"]
    assert list(metrics["hook_errors"].values()) == [3]  # one start, two episodes
    assert caplog.text.count("raised in on_episode_end") == 1  # logged once, then counted


def test_engine_request_wrapper_errors_fail_the_episode_and_engine_errors_stand(tmp_path):
    class Raises:
        @hookimpl(wrapper=True)
        def engine_request(self, request, engine):
            yield
            raise ValueError("cannot record")

    metrics, out = run_with(tmp_path, Raises())
    assert metrics["failed"] == 2 and metrics["completed"] == 0
    failure = json.loads((out / "failures.jsonl").read_text().splitlines()[0])
    assert failure["error_component"].startswith("plugin:") and "raised in engine_request" in failure["error"]

    class Swallows:
        """Observes the engine's error and returns a result instead: the error still fails the request."""

        def __init__(self):
            self.seen = []

        @hookimpl(wrapper=True)
        def engine_request(self, request, engine):
            try:
                return (yield)
            except Exception as exc:
                self.seen.append(type(exc).__name__)
                return None

    swallows = Swallows()
    metrics, out = run_with(tmp_path / "second", swallows, rollout={"request_timeout": 0.05, "retries": 0},
                            engine={"name": "benchmark_canned", "response": "2", "delay_s": 1.0})
    assert metrics["failed"] == 2 and swallows.seen == ["EngineError", "EngineError"]


def test_hook_plugin_notes():
    """What a plugin says about its state here reaches list-plugins; a note that raises is shown, not fatal."""

    class Notes:
        @hookimpl
        def plugin_notes(self):
            return ["sandbox: available", "accelerator: none"]

    class BrokenNotes:
        @hookimpl
        def plugin_notes(self):
            raise RuntimeError("probe failed")

    infos = {info.name: info for info in plugin_set(notes=Notes(), broken=BrokenNotes()).plugin_infos()}
    assert infos["notes"].notes == ["sandbox: available", "accelerator: none"]
    assert infos["notes"].to_json()["notes"] == infos["notes"].notes
    assert infos["broken"].notes == ["plugin_notes failed: RuntimeError: probe failed"]


class _Greeter:
    @hookimpl
    def register_commands(self, subparsers):
        p = subparsers.add_parser("greet", help="say hello")
        p.add_argument("who")
        p.set_defaults(handler=lambda args: print(f"hello {args.who}") or 3)


class _Broken:
    @hookimpl
    def register_commands(self, subparsers):
        subparsers.add_parser("half")
        raise RuntimeError("no luck")


class _Squatter:
    @hookimpl
    def register_commands(self, subparsers):
        subparsers.add_parser("mine")
        subparsers.add_parser("run")


def test_hook_register_commands(capsys):
    """register_commands adds plugin subcommands; a plugin that raises or takes a taken name adds none."""
    from scaffold_core.cli.main import main
    from scaffold_core.plugins import PluginSet, get_plugins, set_plugins

    previous = get_plugins()
    set_plugins(PluginSet().load(entry_points=False,
                                 extra={"greeter": _Greeter(), "broken": _Broken(), "squatter": _Squatter()}))
    try:
        assert main(["greet", "world"]) == 3
        captured = capsys.readouterr()
        assert "hello world" in captured.out
        assert ("plugin 'broken' added no commands: it raised in register_commands: RuntimeError: no luck"
                in captured.err)
        assert "plugin 'squatter' added no commands" in captured.err and "conflicting subparser: run" in captured.err
        for gone in ("half", "mine"):
            with pytest.raises(SystemExit):
                main([gone])
            assert "invalid choice" in capsys.readouterr().err
    finally:
        set_plugins(previous)


class _Reporter:
    def __init__(self, log: list):
        self.log = log

    def count(self, head):
        self.log.append(("count", head.get("episode_id"), head.get("status")))

    def write(self, directory, tokenizer=None):
        self.log.append(("write", str(directory), tokenizer is not None))


class _Reporting:
    def __init__(self):
        self.log: list = []
        self.asked = 0

    @hookimpl
    def run_reporter(self):
        self.asked += 1
        return _Reporter(self.log)


def test_hook_run_reporter(tmp_path, capsys):
    """The reporter counts each episode as `scaffold run` exports it, then writes once the run's files are complete;
    `--no-report` asks for none, and without a reporter the run says no report is written."""
    import yaml

    from scaffold_core.cli.main import main
    from scaffold_core.plugins import PluginSet, get_plugins, set_plugins

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"task": {"name": "list", "rows": ROWS},
                                      "engine": {"name": "benchmark_canned", "response": "2"},
                                      "output": {"save_dataset": False}}), encoding="utf-8")
    reporting = _Reporting()
    previous = get_plugins()
    try:
        set_plugins(PluginSet().load(entry_points=False, extra={"tasks": test_tasks, "reporting": reporting}))
        assert main(["run", str(config), "-o", str(tmp_path / "a"), "--no-progress"]) == 0
        assert sorted(reporting.log[:2]) == [("count", "a", "ok"), ("count", "b", "ok")], reporting.log
        assert reporting.log[2:] == [("write", str(tmp_path / "a"), True)]  # the canned engine's tokenizer
        assert (tmp_path / "a" / "metrics.json").exists()
        assert main(["run", str(config), "-o", str(tmp_path / "b"), "--no-progress", "--no-report"]) == 0
        assert reporting.asked == 1 and len(reporting.log) == 3
        set_plugins(PluginSet().load(entry_points=False, extra={"tasks": test_tasks}))
        capsys.readouterr()
        assert main(["run", str(config), "-o", str(tmp_path / "c"), "--no-progress"]) == 0
        assert "no installed plugin writes reports" in capsys.readouterr().err
        assert not (tmp_path / "c" / "report.html").exists()
    finally:
        set_plugins(previous)
