"""The test kit itself: its helpers work, its fixtures load as a pytest plugin, and its conformance
classes fail on components that break their contract (so a green conformance run means something)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from scaffold_testkit import BackgroundLoop, ListTask, LiveEngine, ScriptedEngine, run_one_episode

from scaffold_core.builtins.verifiers import ExactMatchVerifier

pytest_plugins = ["pytester"]

ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 + 3?", "answer": "6"}]


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "scaffold-test-loop"]


# -- helpers -------------------------------------------------------------------


def test_background_loop_runs_coroutines_and_bounds_waits():
    loop = BackgroundLoop()
    try:
        assert loop.run(asyncio.sleep(0, result="done"), timeout=5) == "done"
        started = time.perf_counter()
        with pytest.raises(TimeoutError, match="within 0.2 s"):
            loop.run(asyncio.sleep(30), timeout=0.2)
        assert time.perf_counter() - started < 5
    finally:
        loop.close()
    assert loop.loop.is_closed()
    loop.close()  # twice is fine


def test_live_engine_generates_and_closes_its_engine_and_thread():
    before = len(_loop_threads())
    engine = ScriptedEngine("#### 42")
    live = LiveEngine.start(engine)
    try:
        assert engine.started
        request = live.request("What is 6 * 7?", __import__("scaffold_core").SamplingParams(max_tokens=32))
        result = live.generate(request)
        assert result.text == "#### 42" and result.finish_reason == "stop"
        assert [r.text for r in live.generate_many([request, request])] == ["#### 42", "#### 42"]
    finally:
        live.close()
    assert engine.closed
    assert len(_loop_threads()) == before


def test_live_engine_start_failure_cleans_up():
    class Broken(ScriptedEngine):
        async def start(self):
            raise RuntimeError("no weights here")

    before = len(_loop_threads())
    engine = Broken()
    with pytest.raises(RuntimeError, match="no weights"):
        LiveEngine.start(engine)
    assert engine.closed
    assert len(_loop_threads()) == before


def test_run_one_episode_by_index_and_by_row():
    task = ListTask(ROWS)
    right = run_one_episode(task, 1, respond="6", verifier=ExactMatchVerifier())
    assert right.ok and right.samples[0].reward == 1.0 and right.reference == "6"
    assert right.trajectories[0].reward == 1.0
    wrong = run_one_episode(task, ROWS[0], respond=lambda prompt, request: "5", verifier=ExactMatchVerifier())
    assert wrong.ok and wrong.samples[0].reward == 0.0
    with pytest.raises(IndexError, match="loaded 2 rows"):
        run_one_episode(task, 5)


def test_fixtures_from_the_pytest_plugin(scaffold_registry_factory, scripted_engine, scaffold_run_episode):
    from scaffold_core import hookimpl

    class Plugin:
        @hookimpl
        def register_verifiers(self, registry):
            registry.add("always_right", lambda: _Always())

    registry = scaffold_registry_factory(Plugin())
    assert "always_right" in registry.names("verifier")
    assert "exact_match" in registry.names("verifier")
    verifier = registry.create("verifier", "always_right")
    result = scaffold_run_episode(ListTask(ROWS), 0, engine=scripted_engine, verifier=verifier)
    assert result.ok and result.samples[0].text == "#### 42" and result.samples[0].reward == 1.0


class _Always(ExactMatchVerifier):
    def verify(self, response, reference):
        from scaffold_core import Verdict

        return Verdict(1.0, response, response, "always")


def test_model_marker_is_added_to_tests_using_the_model(pytester):
    pytester.makepyfile(
        """
        def test_uses_model(smollm2_engine):
            pass

        def test_plain():
            pass
        """
    )
    items, _ = pytester.inline_genitems()
    marked = {item.name: item.get_closest_marker("model") is not None for item in items}
    assert marked == {"test_uses_model": True, "test_plain": False}


# -- the conformance classes catch broken components -------------------------------


def _outcomes(pytester, source: str) -> dict[str, set[str]]:
    pytester.makepyfile(test_subject=source)
    # In-process runs restore sys.modules afterwards: a first import of torch inside one would be
    # undone, and importing torch again later crashes the interpreter. The tensor check is left out.
    rec = pytester.inline_run("-q", "-p", "no:cacheprovider", "-k", "not test_pads_into_a_tensor_dict")
    passed, skipped, failed = rec.listoutcomes()
    name = lambda r: r.nodeid.split("::", 1)[1]  # noqa: E731
    return {"passed": {name(r) for r in passed}, "failed": {name(r) for r in failed}}


BROKEN_VERIFIERS = '''
import threading, time
from scaffold_core import Verdict
from scaffold_testkit.conformance import VerifierConformance

class IntParsing:
    def verify(self, response, reference):
        ok = int(response.split()[-1]) == int(reference)   # raises on garbage
        return Verdict(float(ok), response, None, "")

class SlowOnHuge:
    def verify(self, response, reference):
        if len(response) > 10_000:
            time.sleep(30)
        return Verdict(float(response.strip() == reference), response, None, "")

class StatefulVerifier:
    def verify(self, response, reference):
        self.current = response          # per-call state on self: not thread-safe
        time.sleep(0.001)
        return Verdict(float(self.current.strip() == reference), self.current, None, "")

class RewardsEverything:
    def verify(self, response, reference):
        return Verdict(1.0, response, None, "")

class Base(VerifierConformance):
    gold = [("42", "42")]
    wrong = [("41", "42")]
    time_limit = 1.0
    huge_size = 20_000

class TestIntParsing(Base):
    def make_verifier(self):
        return IntParsing()

class TestSlowOnHuge(Base):
    def make_verifier(self):
        return SlowOnHuge()

class TestStateful(Base):
    def make_verifier(self):
        return StatefulVerifier()

class TestRewardsEverything(Base):
    def make_verifier(self):
        return RewardsEverything()

class RaisesOnMissingReference:
    """Fails the episode loudly when the task gave no reference: allowed, never a silent reward."""
    def verify(self, response, reference):
        if not (reference or "").strip():
            raise ValueError("no reference answer")
        return Verdict(float(response.strip() == reference), response, None, "")

class TestRaisesOnMissingReference(Base):
    def make_verifier(self):
        return RaisesOnMissingReference()
'''


def test_verifier_conformance_catches_broken_verifiers(pytester):
    out = _outcomes(pytester, BROKEN_VERIFIERS)
    assert "TestIntParsing::test_garbage_is_handled" in out["failed"]
    assert "TestIntParsing::test_gold_passes" in out["passed"]
    assert "TestSlowOnHuge::test_huge_input_is_bounded" in out["failed"]
    assert "TestSlowOnHuge::test_garbage_is_handled" in out["passed"]
    assert "TestStateful::test_thread_safe" in out["failed"]
    assert {"TestRewardsEverything::test_wrong_fails",
            "TestRewardsEverything::test_missing_reference_is_not_rewarded"} <= out["failed"]
    assert "TestRaisesOnMissingReference::test_missing_reference_is_not_rewarded" in out["passed"]
    assert "TestRewardsEverything::test_gold_passes" in out["passed"]


BROKEN_ENGINES = '''
from scaffold_core.generation import GenerationResult
from scaffold_testkit import ScriptedEngine
from scaffold_testkit.conformance import EngineConformance

TEXT = "alpha beta gamma delta epsilon zeta eta theta"

class IgnoresLimits(ScriptedEngine):
    """Answers the whole text whatever max_tokens and stop say."""
    async def generate(self, request):
        ids = self.tokenizer.encode(TEXT)
        return GenerationResult(ids, [-0.5] * len(ids), "stop", TEXT)

class DropsStopToken(ScriptedEngine):
    """Leaves a matched stop token out of output_ids (then ids and logprobs no longer describe the sample)."""
    def result_for(self, text, request):
        result = super().result_for(text, request)
        if request.sampling.stop_token_ids and result.output_ids[-1] in request.sampling.stop_token_ids:
            result.output_ids.pop()
            result.logprobs.pop()
        return result

class PositiveLogprobs(ScriptedEngine):
    def result_for(self, text, request):
        result = super().result_for(text, request)
        result.logprobs = [0.5] * len(result.logprobs)
        return result

class Base(EngineConformance):
    max_tokens = 32

class TestIgnoresLimits(Base):
    def make_engine(self):
        return IgnoresLimits()

class TestDropsStopToken(Base):
    def make_engine(self):
        return DropsStopToken(TEXT)

class TestPositiveLogprobs(Base):
    def make_engine(self):
        return PositiveLogprobs(TEXT)

class TestConforming(Base):
    def make_engine(self):
        return ScriptedEngine(TEXT)
'''


def test_engine_conformance_catches_broken_engines(pytester):
    out = _outcomes(pytester, BROKEN_ENGINES)
    assert {"TestIgnoresLimits::test_max_tokens_is_honoured", "TestIgnoresLimits::test_stop_strings_are_honoured",
            "TestIgnoresLimits::test_stop_token_ids_are_honoured"} <= out["failed"]
    assert "TestDropsStopToken::test_stop_token_ids_are_honoured" in out["failed"]
    assert "TestDropsStopToken::test_stop_strings_are_honoured" in out["passed"]
    assert "TestPositiveLogprobs::test_ids_and_logprobs_agree" in out["failed"]
    assert not {f for f in out["failed"] if f.startswith("TestConforming::")}
    assert "TestConforming::test_concurrent_requests" in out["passed"]


BROKEN_CONTROLLERS = '''
import copy
from scaffold_core import Controller, Outcome
from scaffold_core.builtins.controllers import NativeController
from scaffold_testkit.conformance import ControllerConformance

class SharedHistory(Controller):
    """Keeps a history list that clones share, and lets it steer generation."""
    def __init__(self):
        self.history = []
    def clone(self):
        return copy.copy(self)          # shallow: every clone appends to the same list
    def process(self, ctx):
        self.history.append(ctx.episode_id)
        tasks = [ctx.generation_task(i) for i in range(1 if len(self.history) <= 3 else 2)]
        yield tasks
        return Outcome(samples=tasks)

class SwallowsErrors(NativeController):
    """Turns an engine error into an empty, 'successful' episode."""
    def process(self, ctx):
        task = ctx.generation_task(0)
        try:
            yield [task]
        except Exception:
            return Outcome(samples=[])
        return Outcome(samples=[task])

class SharedSubController(Controller):
    def __init__(self):
        self.generator = NativeController()
    def clone(self):
        return copy.copy(self)          # forgets to clone the sub-controller
    def process(self, ctx):
        outcomes = yield self.parallel(self.generator, [ctx.branch(0)])
        return outcomes[0]

class ShallowNative(NativeController):
    """The old shape: a cheap shallow clone, inherited by every subclass (and their hidden state)."""
    def clone(self):
        return copy.copy(self)

class DeclaresItsCache(NativeController):
    """Shares a cache on purpose and says so; a user's subclass of it is still isolated."""
    shared = ("cache",)
    def __init__(self):
        super().__init__()
        self.cache = {}

class TestSharedHistory(ControllerConformance):
    def make_controller(self):
        return SharedHistory()

class TestShallowNative(ControllerConformance):
    def make_controller(self):
        return ShallowNative()

class TestDeclaresItsCache(ControllerConformance):
    isolation_episodes = 200
    def make_controller(self):
        return DeclaresItsCache()

class TestSwallowsErrors(ControllerConformance):
    def make_controller(self):
        return SwallowsErrors()

class TestSharedSubController(ControllerConformance):
    def make_controller(self):
        return SharedSubController()
'''


def test_controller_conformance_catches_broken_controllers(pytester):
    out = _outcomes(pytester, BROKEN_CONTROLLERS)
    assert {"TestSharedHistory::test_clone_shares_no_mutable_state",
            "TestSharedHistory::test_prototype_unchanged_by_episodes",
            "TestSharedHistory::test_repeated_runs_are_reproducible"} <= out["failed"]
    assert "TestSwallowsErrors::test_engine_failure_fails_the_episode" in out["failed"]
    assert "TestSwallowsErrors::test_concurrency_does_not_change_results" in out["passed"]
    assert "TestSharedSubController::test_clone_shares_no_mutable_state" in out["failed"]
    # The isolation tests: a user's subclass adding mutable state leaks through a shallow clone() ...
    isolation = {"test_hidden_state_is_isolated_across_concurrent_episodes",
                 "test_parallel_branches_see_only_their_own_changes"}
    assert {f"TestSharedHistory::{t}" for t in isolation} <= out["failed"]
    assert {f"TestShallowNative::{t}" for t in isolation} <= out["failed"]
    assert "TestShallowNative::test_clone_shares_no_mutable_state" in out["passed"]  # no mutable state of its own
    # ... while a declared shared handle is allowed, and the default clone isolates everything else.
    assert not {f for f in out["failed"] if f.startswith("TestDeclaresItsCache::")}
    assert {f"TestDeclaresItsCache::{t}" for t in isolation} <= out["passed"]


BROKEN_MAKERS = '''
from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker
from scaffold_testkit.conformance import TrajectoryMakerConformance

class TrainsOnPrompt(SingleTurnTrajectoryMaker):
    def make(self, episode):
        out = super().make(episode)
        for t in out:
            t.loss_mask = [1] * len(t.input_ids)
        return out

class DropsEnvironmentMask(SingleTurnTrajectoryMaker):
    def make(self, episode):
        out = super().make(episode)
        for t in out:
            t.loss_mask = [0] * t.prompt_len + [1] * (len(t.input_ids) - t.prompt_len)
        return out

class ShortLogprobs(SingleTurnTrajectoryMaker):
    def make(self, episode):
        out = super().make(episode)
        for t in out:
            t.logprobs = t.logprobs[t.prompt_len:]
        return out

class TestTrainsOnPrompt(TrajectoryMakerConformance):
    def make_trajectory_maker(self):
        return TrainsOnPrompt()

class TestDropsEnvironmentMask(TrajectoryMakerConformance):
    def make_trajectory_maker(self):
        return DropsEnvironmentMask()

class TestShortLogprobs(TrajectoryMakerConformance):
    def make_trajectory_maker(self):
        return ShortLogprobs()
'''


def test_trajectory_conformance_catches_broken_makers(pytester):
    out = _outcomes(pytester, BROKEN_MAKERS)
    assert "TestTrainsOnPrompt::test_masks" in out["failed"]
    assert "TestDropsEnvironmentMask::test_token_faithful" in out["failed"]
    assert "TestDropsEnvironmentMask::test_key_set" in out["passed"]
    assert "TestShortLogprobs::test_equal_lengths" in out["failed"]


BROKEN_TASKS = '''
from scaffold_testkit import ListTask
from scaffold_testkit.conformance import TaskConformance

class WrongReferences(ListTask):
    default_config = {"verifier": {"name": "exact_match"}}
    def reference(self, row):
        return row["answer"] + "."        # the verifier will never match the gold answer

class ShuffledRows(ListTask):
    default_config = {"verifier": {"name": "exact_match"}}
    def load(self):
        import random
        rows = list(self.rows)
        random.shuffle(rows)
        return rows

ROWS = [{"id": i, "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]

class TestWrongReferences(TaskConformance):
    def make_task(self):
        return WrongReferences(ROWS)
    def gold_response(self, row, reference):
        return row["answer"]

class TestShuffled(TaskConformance):
    def make_task(self):
        return ShuffledRows(ROWS)

class TestNoVerifier(TaskConformance):
    def make_task(self):
        return ListTask(ROWS)
'''


def test_task_conformance_catches_broken_tasks(pytester):
    out = _outcomes(pytester, BROKEN_TASKS)
    assert {"TestWrongReferences::test_gold_answer_passes_the_verifier",
            "TestWrongReferences::test_one_episode_end_to_end"} <= out["failed"]
    assert "TestWrongReferences::test_prompts_build" in out["passed"]
    assert "TestShuffled::test_rows_load" in out["failed"]
    assert "TestNoVerifier::test_gold_answer_passes_the_verifier" in out["failed"]


def test_the_branch_isolation_test_catches_branches_that_share_the_episodes_data(monkeypatch):
    """Run against a core whose branches shared the episode's row, messages and state, the kit's test fails."""
    from scaffold_testkit.conformance import ControllerConformance

    from scaffold_core.episode import EpisodeContext

    def sharing_branch(self, index):
        return EpisodeContext(episode_id=self.episode_id, index=self.index, row=self.row, prompt_ids=self.prompt_ids,
                              sampling=self.sampling, seed=self.seed, reference=self.reference,
                              prompt_text=self.prompt_text, messages=self.messages, tokenizer=self.tokenizer,
                              attempt=self.attempt, sample_base=self.sample_base + index, state=self.state)

    class CheckNative(ControllerConformance):
        name = "native"

    CheckNative().test_parallel_branches_see_only_their_own_changes()  # the real core: isolated
    monkeypatch.setattr(EpisodeContext, "branch", sharing_branch)
    with pytest.raises(AssertionError, match="branches saw changes that were not their own"):
        CheckNative().test_parallel_branches_see_only_their_own_changes()
BROKEN_TOOLS = '''
import time
from scaffold_core.tool import Tool, ToolResult
from scaffold_testkit.conformance import ToolConformance

class Echo(Tool):
    name = "echo"
    description = "Echo the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                  "additionalProperties": False}
    async def call(self, arguments, context):
        return ToolResult(arguments["text"])

class Blocking(Echo):
    async def call(self, arguments, context):
        time.sleep(0.4)                     # a synchronous client inside an async call
        return ToolResult(arguments["text"])

class RemembersLast(Echo):
    async def call(self, arguments, context):
        import asyncio
        self.last = arguments["text"]       # per-call state on the shared tool
        await asyncio.sleep(0.01)
        return ToolResult(self.last)

class Counting(Echo):
    counts: dict = {}                       # class-level state
    async def call(self, arguments, context):
        self.counts[context.episode_id] = self.counts.get(context.episode_id, 0) + 1
        return ToolResult(arguments["text"])

class Base(ToolConformance):
    calls = [{"text": "alpha"}, {"text": "beta"}, {"text": "gamma"}]

class TestEcho(Base):
    def make_tool(self):
        return Echo()

class TestBlocking(Base):
    def make_tool(self):
        return Blocking()

class TestRemembersLast(Base):
    def make_tool(self):
        return RemembersLast()

class TestCounting(Base):
    def make_tool(self):
        return Counting()
'''


def test_tool_conformance_catches_broken_tools(pytester):
    out = _outcomes(pytester, BROKEN_TOOLS)
    assert not {f for f in out["failed"] if f.startswith("TestEcho::")}
    assert "TestBlocking::test_does_not_block_the_event_loop" in out["failed"]
    assert "TestBlocking::test_example_calls_succeed" in out["passed"]
    assert "TestRemembersLast::test_concurrent_calls_agree_with_serial_ones" in out["failed"]
    assert {"TestCounting::test_no_class_level_mutable_state",
            "TestCounting::test_calls_leave_class_state_unchanged"} <= out["failed"]


BROKEN_GAPS = '''
import time
from scaffold_core import Verdict
from scaffold_core.builtins.controllers import NativeController
from scaffold_testkit import ListTask
from scaffold_testkit.conformance import ControllerConformance, TaskConformance, VerifierConformance

class StrReference:
    """Turns a list reference into text and looks for the response in it."""
    def verify(self, response, reference):
        ok = bool(response.strip()) and response.strip() in str(reference)
        return Verdict(float(ok), response, None, "")

class SlowInline:
    """Runs on the event loop, and slowly on long responses."""
    executor = "inline"
    def verify(self, response, reference):
        if len(response) > 1000:
            time.sleep(0.3)
        return Verdict(float(response.strip() == reference), response, None, "")

class RaisesOnWrong:
    """Fails loudly on anything but the right answer: wrong answers never reach training."""
    def verify(self, response, reference):
        if response.strip() != reference:
            raise ValueError("cannot parse the answer")
        return Verdict(1.0, response, None, "")

class SleepyController(NativeController):
    def process(self, ctx):
        if ctx.index == 0:
            time.sleep(0.4)                 # blocks every other episode
        return (yield from super().process(ctx))

class TestStrReference(VerifierConformance):
    gold = [("42", "42"), ("Paris", "Paris")]
    wrong = [("41", "42")]
    huge_size = 20_000
    def make_verifier(self):
        return StrReference()

class TestSlowInline(VerifierConformance):
    gold = [("42", "42")]
    wrong = [("41", "42")]
    huge_size = 2_000
    def make_verifier(self):
        return SlowInline()

ROWS = [{"id": i, "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]

class TestRaisesOnWrong(TaskConformance):
    def make_task(self):
        return ListTask(ROWS)
    def make_verifier(self):
        return RaisesOnWrong()

class TestSleepyController(ControllerConformance):
    rows = ROWS[:3]
    def make_controller(self):
        return SleepyController()
'''


def test_the_kit_catches_what_would_poison_training(pytester):
    out = _outcomes(pytester, BROKEN_GAPS)
    assert "TestStrReference::test_structured_references_are_handled" in out["failed"]
    assert "TestStrReference::test_gold_passes" in out["passed"]
    assert "TestSlowInline::test_inline_verifier_does_not_block_the_event_loop" in out["failed"]
    assert {"TestRaisesOnWrong::test_wrong_answers_are_not_rewarded",
            "TestRaisesOnWrong::test_all_wrong_episode_is_completed_with_no_reward"} <= out["failed"]
    assert "TestRaisesOnWrong::test_gold_answer_passes_the_verifier" in out["passed"]
    assert "TestSleepyController::test_does_not_block_the_event_loop" in out["failed"]
    assert "TestSleepyController::test_episodes_complete" in out["passed"]


# -- test servers die with the test run -------------------------------------------------------------------
_LISTENER = """
import socket, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
with socket.create_server(("127.0.0.1", port)):
    time.sleep(120)
"""

_STARTER = """
import sys, time
from pathlib import Path
from scaffold_testkit.remote_server import ServerSubprocess
server = ServerSubprocess(Path(sys.argv[1]), [sys.executable, "-c", sys.argv[2]]).start()
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_test_server_dies_with_a_test_run_killed_before_its_teardown(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    starter = subprocess.Popen([sys.executable, "-c", _STARTER, str(tmp_path), _LISTENER], stdout=subprocess.PIPE)
    try:
        line = starter.stdout.readline()
        assert line.strip().isdigit(), "the test server did not start"
        server_pid = int(line)
    finally:
        starter.send_signal(signal.SIGKILL)  # no teardown runs
        starter.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        try:
            if open(f"/proc/{server_pid}/stat").read().split()[2] == "Z":  # dead, waiting to be reaped
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(server_pid, signal.SIGKILL)
    raise AssertionError("the test server outlived the killed test run")
