"""Live progress: a bar on a terminal, plain periodic lines in a log; tokens counted while a batch decodes;
the eval's bar counts answers; training steps show the reward and the time left."""

from __future__ import annotations

import asyncio
import io
import sys

import pytest
from scaffold_testkit import plugin_set
from scaffold_testkit.engines import ScriptedEngine

from scaffold_core.config import load_config
from scaffold_core.plugins.markers import hookimpl
from scaffold_core.run import progress as progress_module
from scaffold_core.run.progress import Progress, clock_text
from scaffold_core.run.rollout import Rollout


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Log(io.StringIO):
    def isatty(self):
        return False


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_outside_a_terminal_a_plain_line_comes_every_interval_with_the_time_left():
    clock, log = Clock(), Log()
    bar = Progress(40, enabled=None, stream=log, interval=15, clock=clock)
    assert bar.mode == "lines"
    bar.advance(1, "samples 1")
    assert log.getvalue() == ""  # not yet 15 s
    clock.now += 16
    bar.advance(9, "samples 10  tokens 2,048")
    line = log.getvalue().splitlines()[-1]
    assert line.startswith("scaffold: episodes 10/40 (25%)  samples 10  tokens 2,048")
    assert "elapsed 0:16" in line and "eta 0:48" in line
    clock.now += 16
    bar.update("samples 10  tokens 4,096")  # nothing finished: a line all the same
    assert "episodes 10/40" in log.getvalue().splitlines()[-1] and "4,096" in log.getvalue()
    bar.close()
    assert len(log.getvalue().splitlines()) == 3


def test_on_a_terminal_it_is_a_bar_and_off_is_silent():
    term = Terminal()
    bar = Progress(4, enabled=None, stream=term, clock=Clock())
    bar.advance(2, "tokens 9")
    bar.close()
    assert bar.mode == "bar" and "2/4" in term.getvalue() and "tokens 9" in term.getvalue()
    quiet = Log()
    off = Progress(4, enabled=False, stream=quiet)
    off.advance(4, "x")
    off.close()
    assert quiet.getvalue() == ""
    assert clock_text(3725) == "1:02:05" and clock_text(None) == "?"


async def shown(log: Log, text: str) -> None:
    """Until the progress has printed ``text`` (up to 10 s)."""
    for _ in range(1000):
        if text in log.getvalue():
            return
        await asyncio.sleep(0.01)


class Decoding(ScriptedEngine):
    """Counts decoded tokens before it answers, and answers only once the progress has shown them."""

    log: Log

    async def generate(self, request):
        self.decoded_tokens = (self.decoded_tokens or 0) + 7
        await shown(self.log, "tokens 7")
        return await super().generate(request)


class EnginePlugin:
    """Registers ``cls`` (a ScriptedEngine answering "#### 2" that reads the progress ``log``) as ``name``."""

    def __init__(self, name, cls, log):
        self.name, self.cls, self.log = name, cls, log

    @hookimpl
    def register_engines(self, registry):
        def make():
            engine = self.cls("#### 2")
            engine.log = self.log
            return engine

        registry.add(self.name, make)


def test_the_run_shows_tokens_while_the_first_episode_decodes(tmp_path, monkeypatch):
    log = Log()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL_S", 0.05)
    monkeypatch.setattr(progress_module, "BAR_INTERVAL_S", 0.05)
    import scaffold_testkit.plugin as test_tasks

    plugins = plugin_set(test_tasks, decoding=EnginePlugin("decoding", Decoding, log))
    config = load_config(data={"task": {"name": "list", "rows": [{"question": "1+1?", "answer": "2"}]},
                               "engine": {"name": "decoding"}}, registry=plugins.registry)
    Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    lines = log.getvalue().splitlines()
    assert any(line.startswith("scaffold: episodes 0/1") and "tokens 7" in line for line in lines)
    assert lines[-1].startswith("scaffold: episodes 1/1 (100%)")


@pytest.mark.parametrize("steps", [3])
def test_training_lines_show_the_reward_and_the_time_left(test_plugins, tmp_path, steps):
    from scaffold_core.train.session import run_training

    path = tmp_path / "t.yaml"
    path.write_text("task: {name: arithmetic, count: 2}\nengine: {name: benchmark_canned, response: '4'}\n"
                    f"trainer: {{name: rollout_only, steps: {steps}, group: 2}}\n")
    stream = Log()
    run_training(load_config(path), tmp_path / "t", progress=None, stream=stream)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("step ")]
    assert len(lines) == steps and "reward_mean=" in lines[0]
    assert "elapsed " in lines[0] and "eta " in lines[0]


def test_a_count_without_a_known_total_has_no_share_and_no_eta():
    clock, log = Clock(), Log()
    bar = Progress(None, enabled=None, stream=log, interval=15, clock=clock, desc="episodes (2 workers)")
    clock.now += 20
    bar.advance(5)
    bar.close()
    assert log.getvalue().splitlines()[0] == "scaffold: episodes (2 workers) 5  elapsed 0:20  eta ?"


class SecondWaits(ScriptedEngine):
    """Answers the first request at once and the second only once the progress counted the first's tokens."""

    log: Log

    async def generate(self, request):
        if self.requests:
            await shown(self.log, "tokens 7")
        return await super().generate(request)


def test_tokens_of_returned_answers_count_before_their_episode_ends(tmp_path, monkeypatch):
    import scaffold_testkit.plugin as test_tasks

    log = Log()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL_S", 0.05)
    monkeypatch.setattr(progress_module, "BAR_INTERVAL_S", 0.05)
    plugins = plugin_set(test_tasks, second=EnginePlugin("second_waits", SecondWaits, log))
    config = load_config(data={"task": {"name": "list", "rows": [{"question": "1+1?", "answer": "2"}]},
                               "engine": {"name": "second_waits"}, "controller": {"name": "repeat", "n": 2},
                               "sampling": {"temperature": 0.7}}, registry=plugins.registry)
    Rollout(config, output_dir=tmp_path / "run", plugins=plugins, answers_per_episode=2).run()
    lines = log.getvalue().splitlines()
    assert any(line.startswith("scaffold: answers 0/2") and "tokens 7" in line for line in lines)
    assert lines[-1].startswith("scaffold: answers 2/2 (100%)")
