"""Five broken third-party plugins, written as an author would from the docs (tests/fixtures/plugins), each with
its own conformance tests: the kit fails each with a message that names the fault and the fix.

* scaffold-bonus: a verifier whose rewards leave [0, 1] (1.5 with a "format bonus", -1 as a "penalty");
* scaffold-memo: a controller keeping state in a class-level dict (shared by every instance and clone);
* scaffold-nearmiss: a task/verifier pair that rewards off-by-one answers (only right answers were tested);
* scaffold-syncengine: an engine that blocks the event loop (a synchronous call inside ``async def generate``);
* scaffold-clash: a controller named ``native`` and a task named ``gsm8k``, names others already register.

Each of them passes the checks that existed before its gap was closed (clone isolation, gold answers, output
limits, ...): those are asserted to pass too, so the failures below are the gap checks and nothing else.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "plugins"
PLUGINS = ("bonus", "memo", "nearmiss", "syncengine", "clash")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """plugin -> {test id: failure message, or None when it passed} from one pytest run over all five."""
    work = tmp_path_factory.mktemp("kit")
    (work / "pytest.ini").write_text("[pytest]\n")
    report = work / "report.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(str(FIXTURES / f"scaffold-{name}") for name in PLUGINS)
    env["SCAFFOLD_DISABLE_PLUGINS"] = ""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         "-c", str(work / "pytest.ini"), f"--rootdir={FIXTURES}", f"--confcutdir={FIXTURES}",
         f"--junitxml={report}", *(str(FIXTURES / f"scaffold-{name}" / "tests") for name in PLUGINS)],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert report.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    out: dict[str, dict[str, str | None]] = {name: {} for name in PLUGINS}
    for case in ET.parse(report).getroot().iter("testcase"):
        plugin = next(n for n in PLUGINS if f"scaffold-{n}" in case.get("classname", "").replace(".", "/")
                      or f"scaffold_{n}" in case.get("classname", ""))
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failure = case.find("failure")
        error = case.find("error")
        if case.find("skipped") is not None:
            continue
        bad = failure if failure is not None else error
        out[plugin][test] = None if bad is None else f"{bad.get('message', '')}\n{bad.text or ''}"
    assert all(out.values()), f"some fixture plugins ran no tests: {proc.stdout[-3000:]}"
    return out


def failed(results: dict[str, str | None]) -> set[str]:
    return {test for test, message in results.items() if message is not None}


def test_out_of_range_rewards_are_caught(outcomes):
    results = outcomes["bonus"]
    message = results["TestBonusVerifier::test_rewards_are_finite_and_within_reward_range"]
    assert message is not None
    assert "gave reward 1.5" in message or "gave reward -1.0" in message
    assert "outside its reward_range (0, 1)" in message and "reward_range = (low, high)" in message
    # what the kit checked before still passes: the fault is the range alone
    assert results["TestBonusVerifier::test_executor_is_valid"] is None
    assert results["TestBonusVerifier::test_thread_safe"] is None


def test_class_level_mutable_state_is_caught(outcomes):
    results = outcomes["memo"]
    assert failed(results) == {"TestMemoController::test_no_class_level_mutable_state",
                               "TestMemoController::test_episodes_leave_class_state_unchanged"}
    static = results["TestMemoController::test_no_class_level_mutable_state"]
    assert "MemoController.answers_seen" in static and "shared by every instance and every clone" in static
    assert "Create it per instance in __init__" in static and "ctx.state" in static
    dynamic = results["TestMemoController::test_episodes_leave_class_state_unchanged"]
    assert "changed by running episodes: MemoController.answers_seen" in dynamic
    # the checks that existed before all pass: clones share no instance state, results are reproducible
    for test in ("test_clone_shares_no_mutable_state", "test_prototype_unchanged_by_episodes",
                 "test_concurrency_does_not_change_results", "test_repeated_runs_are_reproducible"):
        assert results[f"TestMemoController::{test}"] is None, test


def test_a_pair_that_rewards_wrong_answers_is_caught(outcomes):
    results = outcomes["nearmiss"]
    assert failed(results) == {"TestAdditionTask::test_wrong_answers_are_not_rewarded",
                               "TestAdditionTask::test_all_wrong_episode_is_completed_with_no_reward"}
    message = results["TestAdditionTask::test_wrong_answers_are_not_rewarded"]
    assert "the task's verifier rewarded a wrong answer" in message and "got Verdict(reward=1.0" in message
    assert "make the verifier compare the extracted answer with the reference" in message
    assert results["TestAdditionTask::test_gold_answer_passes_the_verifier"] is None
    assert results["TestAdditionTask::test_one_episode_end_to_end"] is None


def test_an_engine_blocking_the_event_loop_is_caught(outcomes):
    results = outcomes["syncengine"]
    assert failed(results) == {"TestSyncEchoEngine::test_does_not_block_the_event_loop"}
    message = results["TestSyncEchoEngine::test_does_not_block_the_event_loop"]
    assert "the engine held the event loop for" in message and "max_loop_block" in message
    assert "asyncio.to_thread" in message and "never call time.sleep" in message


def test_a_name_clash_is_caught(outcomes):
    results = outcomes["clash"]
    controller = results["TestTaggedNativeController::test_name_is_unique"]
    assert controller is not None and "name clash: controller 'native' is also registered by the built-in" in controller
    assert "Rename the component" in controller
    if importlib.util.find_spec("scaffold_gsm8k") is not None:  # installed here: its gsm8k task clashes too
        assert "task 'gsm8k' is also registered by installed plugin 'gsm8k' (scaffold-gsm8k)" in controller
    # the component itself keeps its contract: the kit builds the plugin's own 'native' to check it
    assert results["TestTaggedNativeController::test_episodes_complete"] is None
    assert results["TestTaggedNativeController::test_concurrency_does_not_change_results"] is None
