"""Environments as their authors write them (tests/envs, shaped like the library's own): a two-seat zero-sum game
whose tasks have no prompt (the environment talks to each seat), a code rubric that runs the model's program
(in scaffold's jail unless the config opts into this machine, loudly), and environments written for the
verifiers API before 0.4 (one line naming the API and the fix)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

vf = pytest.importorskip("verifiers.v1")

import scaffold_verifiers  # noqa: E402
from scaffold_testkit import ScriptedEngine, plugin_set  # noqa: E402
from scaffold_verifiers.environment import UnsupportedEnvironment  # noqa: E402
from scaffold_verifiers.task import VerifiersTask  # noqa: E402

import scaffold_multiturn  # noqa: E402
import scaffold_serve  # noqa: E402
from scaffold_core import hookimpl  # noqa: E402
from scaffold_core.config import load_config  # noqa: E402
from scaffold_core.output import read_records  # noqa: E402
from scaffold_core.run.rollout import Rollout  # noqa: E402

ENVS = Path(__file__).resolve().parent / "envs"


def duel_reply(prompt: str, request: Any) -> str:
    """Player 0 plays heads, except in hand 3, where it mumbles (a forfeit: player 1 never acts); player 1 plays
    tails in even hands and heads in odd ones."""
    hand = int(prompt.split(" in hand ", 1)[1][0])
    if "as Player 0" in prompt:
        return "Hmm, let me think." if hand == 3 else "[heads]"
    return "[tails]" if hand % 2 == 0 else "I pick [heads]"


def golf_reply(prompt: str, request: Any) -> str:
    if "1 to 100" in prompt:
        return "```python\nprint(sum(range(101)))\n```"
    if "HELLO" in prompt:
        return "```python\nprint('HELLO'[::-1])\n```"
    return f"```python\nprint(open({os.environ['SCAFFOLD_GOLF_SECRET']!r}).read())\n```"  # a file of this machine


class Engines:
    @hookimpl
    def register_engines(self, registry):
        registry.add("scripted_duel", lambda: ScriptedEngine(duel_reply))
        registry.add("scripted_golf", lambda: ScriptedEngine(golf_reply))


@pytest.fixture(scope="module")
def pset():
    return plugin_set(scaffold_multiturn, scaffold_serve, scaffold_verifiers, Engines())


def scaffold_run(pset, out: Path, engine: str, **task: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    config = load_config(data={"task": {"name": "verifiers", **task}, "engine": {"name": engine},
                               "sampling": {"max_tokens": 256}, "trajectory": {"name": "multiturn"}},
                         registry=pset.registry)
    metrics = Rollout(config, output_dir=out, plugins=pset, progress=False).run()
    episodes = {e["episode_id"]: e for e in read_records(out)}
    return metrics, episodes


# -- a two-seat game ------------------------------------------------------------------------------------------


def test_a_two_seat_game_keeps_every_seat_and_averages_to_zero(pset, tmp_path):
    """Each hand is one episode; a seat that acted gives a sample with its own payoff (the library's), a seat
    that never acted (its opponent forfeited) is counted; each seat's reward is in the metrics, and the seats
    of this zero-sum game average to 0 in every episode."""
    metrics, episodes = scaffold_run(pset, tmp_path / "run", "scripted_duel", env="scaffold_vf_duel")
    assert (metrics["completed"], metrics["failed"]) == (4, 0), episodes
    assert sorted(episodes) == ["0", "1", "2", "3"]  # four hands, though their tasks have no prompt of their own
    payoffs = {hand: [(s["metadata"]["agent"], s["reward"]) for s in episodes[hand]["samples"]] for hand in episodes}
    assert payoffs == {"0": [("player0", -1.0), ("player1", 1.0)], "1": [("player0", 1.0), ("player1", -1.0)],
                       "2": [("player0", -1.0), ("player1", 1.0)], "3": [("player0", -1.0)]}
    assert episodes["3"]["metrics"]["idle_seats"] == 1.0 and episodes["0"]["metrics"]["idle_seats"] == 0.0
    assert all(e["metrics"]["seats"] == 2.0 and e["metrics"]["seat_reward_mean"] == 0.0 for e in episodes.values())
    assert episodes["3"]["metrics"]["seat_reward/player1"] == 1.0  # the seat that never acted still won its chip
    assert metrics["seat_reward_mean"] == 0.0 and metrics["idle_seats"] == 0.25
    assert metrics["seat_reward/player0"] == -0.5 and metrics["seat_reward/player1"] == 0.5
    assert all(s["verdict_metrics"]["reward/payoff"] == s["reward"] for e in episodes.values() for s in e["samples"])


def test_rows_of_environment_built_prompts_are_told_apart_by_identity(pset):
    """The hands render the same (empty) opening, yet each is its own row, by id: what a trainer groups by."""
    task = VerifiersTask(env="scaffold_vf_duel")
    rows = task.load()
    assert [r["id"] for r in rows] == ["0", "1", "2", "3"]
    assert len({json.dumps(task.messages(r)) for r in rows}) == 1


# -- a code rubric ---------------------------------------------------------------------------------------------


@pytest.fixture
def secret(tmp_path, monkeypatch) -> str:
    path = tmp_path / "secret.txt"
    path.write_text("swordfish")
    monkeypatch.setenv("SCAFFOLD_GOLF_SECRET", str(path))
    return str(path)


def jail_or_skip() -> None:
    from scaffold_tools.jail import JailUnavailable, check_bwrap

    try:
        check_bwrap()
    except JailUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def test_a_code_rubric_runs_the_models_program_in_the_jail_by_default(pset, tmp_path, secret):
    """The rubric's program runs (its reward is the library's for the same completions: the programs that print
    what was asked pass), but in the jail: the program asked to print a file of this machine cannot read it."""
    jail_or_skip()
    metrics, episodes = scaffold_run(pset, tmp_path / "run", "scripted_golf", env="scaffold_vf_golf_single",
                                     env_args={"secret": "swordfish"})
    assert (metrics["completed"], metrics["failed"]) == (3, 0), episodes
    rewards = {k: e["samples"][0]["reward"] for k, e in episodes.items()}
    assert rewards == {"sum": 1.0, "reverse": 1.0, "secret": 0.0}
    assert episodes["secret"]["samples"][0]["response"].endswith("```")  # the whole program, cut by nothing
    assert episodes["sum"]["samples"][0]["verdict_metrics"]["metric/passed"] == 1.0


def test_running_a_code_rubric_on_this_machine_is_an_explicit_loud_opt_in(pset, tmp_path, secret, capfd):
    from scaffold_verifiers import jail_runtime

    jail_runtime._warned.clear()
    metrics, episodes = scaffold_run(pset, tmp_path / "run", "scripted_golf", env="scaffold_vf_golf_single",
                                     env_args={"secret": "swordfish"}, code_execution="host")
    assert episodes["secret"]["samples"][0]["reward"] == 1.0  # unjailed, the program read this machine's file
    assert "WARNING: task.code_execution: host" in capfd.readouterr().err
    with pytest.raises(ValueError, match="code_execution must be jail .* or host"):
        VerifiersTask(env="scaffold_vf_golf_single", code_execution="yes")


def test_the_library_rollout_scores_code_in_the_jail_too(pset, tmp_path, secret):
    """The code-golf shape proper: its own Env plays two attempts per task through the library's rollout; the
    scoring the rollout runs gets scaffold's jail, not the agent's runtime on this machine."""
    jail_or_skip()
    metrics, episodes = scaffold_run(pset, tmp_path / "run", "scripted_golf", env="scaffold_vf_golf",
                                     env_args={"secret": "swordfish"}, limit=2)
    ok = {k: e for k, e in episodes.items() if e["status"] == "ok"}
    assert sorted(ok) == ["reverse", "sum"], episodes
    assert all(len(e["samples"]) == 2 and all(s["reward"] == 1.0 for s in e["samples"]) for e in ok.values())
    assert metrics["seat_reward/golfer"] == 1.0


def test_the_jail_runtime_runs_python_only_and_says_so():
    jail_or_skip()
    from scaffold_verifiers.jail_runtime import jail_runtime_class
    from verifiers.v1.errors import SandboxError

    runtime = jail_runtime_class()({"data.txt": b"7\n"})

    async def go():
        await runtime.write("main.py", b"import sys\nprint(int(open('data.txt').read()) * 6, sys.argv[1:])")
        done = await runtime.run(["python3", "-u", "main.py", "x"], {})
        inline = await runtime.run(["python", "-c", "print('hi')"], {})
        with pytest.raises(SandboxError, match="runs Python programs only"):
            await runtime.run(["sh", "-c", "cat /etc/passwd"], {})
        with pytest.raises(SandboxError, match="was not written"):
            await runtime.run(["python3", "other.py"], {})
        return done, inline, await runtime.read("main.py")

    done, inline, source = asyncio.run(go())
    assert (done.exit_code, done.stdout) == (0, "42 ['x']\n") and inline.stdout == "hi\n"
    assert source.startswith(b"import sys")


# -- the verifiers API before 0.4 ------------------------------------------------------------------------------


@pytest.mark.parametrize("env, cause", [("scaffold_vf_legacy", "No module named 'verifiers.envs'"),
                                        ("scaffold_vf_legacy_lazy", "defines load_environment")])
def test_an_environment_for_the_api_before_0_4_gets_one_line_naming_it_and_the_fix(env, cause):
    with pytest.raises(UnsupportedEnvironment) as info:
        VerifiersTask(env=env)
    text = str(info.value)
    assert "\n" not in text and "written for the verifiers API before 0.4" in text and cause in text
    assert "not found" not in text and "Fix: install a release of the environment written for verifiers>=0.4" in text


# -- training on the embedded engine -----------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_scaffold_train_runs_two_steps_on_a_two_seat_game(tmp_path, tiny_policy):
    """Two TRL steps of self-play on the game (on the test kit's tiny policy: the plumbing is tested, not the
    play): every hand is a row of its own (none merged by their identical openings), the seats' samples train,
    and the run trains (optimizer steps taken)."""
    pytest.importorskip("scaffold_trl")
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({
        "task": {"name": "verifiers", "env": "scaffold_vf_duel"},
        "engine": {"name": "transformers", "model": str(tiny_policy), "threads": 1, "max_batch_size": 8},
        "sampling": {"max_tokens": 32, "temperature": 1.0},
        "trainer": {"name": "trl", "max_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                    "learning_rate": 1e-5, "seed": 0, "threads": 1, "filter_groups": "none"},
    }), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "train", str(config), "-o", str(tmp_path / "run"),
                          "--no-progress", "--no-report"], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["optimizer_steps"] == 2 and summary["same_text_prompts"] == 3
    steps = [json.loads(line) for line in (tmp_path / "run" / "train_metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(s["loss"]) and -1.0 <= s["reward_mean"] <= 1.0 for s in steps), steps
