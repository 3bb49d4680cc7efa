"""`scaffold eval` end to end on scripted engines: answers per problem, eval.json, resume, the CLI."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from scaffold_core.cli import main
from scaffold_core.errors import ConfigError
from scaffold_core.output.reader import EpisodeReader
from scaffold_report.eval.command import run_eval
from scaffold_report.eval.estimators import pass_at_k, pass_hat_k


def ledger(directory):
    with EpisodeReader(directory) as reader:
        return list(reader.heads())


def test_eval_draws_max_k_independent_answers_and_writes_the_figures(eval_dir):
    figures = json.loads((eval_dir / "eval.json").read_text())
    assert figures["k"] == [1, 2, 4] and figures["answers_per_problem"] == 4
    assert figures["config"]["controller"] == {"name": "repeat", "n": 4, "controller": {"name": "native"}}
    assert figures["versions"]["scaffold-core"] and figures["versions"]["components"]["engine"]["name"] == "dice"
    heads = ledger(eval_dir)
    assert len(heads) == 12
    for head in heads:
        assert [s["metadata"]["branch"] for s in head["samples"]] == [0, 1, 2, 3]
        assert [s["sample_index"] for s in head["samples"]] == [0, 1, 2, 3]
        assert all("branch_answer" in s["metadata"] for s in head["samples"])
    responses = {s["response"] for h in heads for s in h["samples"]}
    assert len(responses) > 12  # the runs of a problem are independent draws, not copies
    # every figure is the mean of the per-problem estimates over the ledger's answers
    correct = [sum(1 for s in h["samples"] if s["reward"] == 1.0) for h in heads]
    for entry in figures["by_k"]:
        k = entry["k"]
        assert entry["problems"] == 12
        assert entry["pass@k"]["value"] == pytest.approx(sum(pass_at_k(4, c, k) for c in correct) / 12, abs=1e-6)
        assert entry["pass^k"]["value"] == pytest.approx(sum(pass_hat_k(4, c, k) for c in correct) / 12, abs=1e-6)
        assert entry["best_of_n@k"]["value"] == entry["pass@k"]["value"]  # picked by the verifier: an oracle
        low, high = entry["pass@k"]["ci"]
        assert low <= entry["pass@k"]["value"] <= high
    passes = [e["pass@k"]["value"] for e in figures["by_k"]]
    assert passes == sorted(passes) and passes[0] < passes[-1]
    tokens = [e["tokens_per_problem"]["value"] for e in figures["by_k"]]
    assert tokens[1] == pytest.approx(2 * tokens[0]) and tokens[2] == pytest.approx(4 * tokens[0])


def test_resume_reuses_the_answers_and_computes_other_ks(eval_dir, dice_plugins, tmp_path, dice_config):
    import shutil

    out = tmp_path / "again"
    shutil.copytree(eval_dir, out)
    before = (out / "episodes.db").read_bytes()
    result = run_eval(dice_config(), [1, 3], output_dir=out, resume=True, plugins=dice_plugins,
                      progress=False)
    assert (out / "episodes.db").read_bytes() == before  # nothing ran again
    assert result.metrics["resumed_episodes"] == 12
    figures = json.loads((out / "eval.json").read_text())
    assert figures["k"] == [1, 3] and figures["answers_per_problem"] == 4  # the run's 4 answers are kept
    with pytest.raises(ConfigError, match="holds 4 answers per problem, fewer than k=8"):
        run_eval(dice_config(), [8], output_dir=out, resume=True, plugins=dice_plugins, progress=False)


def test_a_voting_controller_is_one_answer_per_run(dice_plugins, tmp_path, dice_config):
    config = dice_config(task={"name": "sums", "count": 3},
                         controller={"name": "majority_vote", "samples": 3})
    result = run_eval(config, [1, 2], output_dir=tmp_path / "vote", plugins=dice_plugins, progress=False)
    heads = ledger(tmp_path / "vote")
    for head in heads:
        samples = head["samples"]
        assert [s["sample_index"] for s in samples] == list(range(6))  # 2 runs x 3 votes, numbered apart
        assert [s["metadata"]["branch"] for s in samples] == [0, 0, 0, 1, 1, 1]
        answers = [s["metadata"]["branch_answer"] for s in samples if "branch_answer" in s["metadata"]]
        assert len(answers) == 2
    assert result.figures["answers"]["scored"] + result.figures["answers"]["unscored"] == 6
    tokens_per_answer = result.figures["answers"]["mean_tokens"]
    per_sample = sum(s["generated_tokens"] for h in heads for s in h["samples"]) / 18
    assert tokens_per_answer == pytest.approx(3 * per_sample, rel=0.35)  # an answer costs its three votes


def test_a_controller_with_several_unnamed_answers_is_refused_before_anything_runs(dice_plugins, tmp_path, dice_config):
    config = dice_config(controller={"name": "native", "samples": 4})
    with pytest.raises(ConfigError, match="native.*samples=4 names no single answer"):
        run_eval(config, [1, 2], output_dir=tmp_path / "x", plugins=dice_plugins, progress=False)
    assert not (tmp_path / "x" / "episodes.db").exists()


def test_best_of_n_by_logprob_and_by_another_verifier(eval_dir, dice_plugins):
    from scaffold_report.eval.command import compute_eval

    by_logprob = compute_eval(eval_dir, [1, 4], select="logprob", registry=dice_plugins.registry)
    by_verifier = compute_eval(eval_dir, [1, 4], select="exact_match", registry=dice_plugins.registry)
    oracle = compute_eval(eval_dir, [1, 4], registry=dice_plugins.registry)
    pass4 = oracle["by_k"][1]["pass@k"]["value"]
    assert by_logprob["by_k"][1]["best_of_n@k"]["value"] <= pass4
    assert by_logprob["by_k"][0]["best_of_n@k"]["value"] == oracle["by_k"][0]["pass@k"]["value"]  # k=1: no choice
    assert by_verifier["select"] == "exact_match" and by_verifier["by_k"][1]["best_of_n@k"]["value"] <= pass4


def test_unknown_selection_is_refused_before_anything_runs(dice_plugins, tmp_path, dice_config):
    from scaffold_core.errors import UnknownComponentError

    with pytest.raises(UnknownComponentError, match="nope"):
        run_eval(dice_config(), [1], output_dir=tmp_path / "x", select="nope", plugins=dice_plugins,
                 progress=False)
    assert not (tmp_path / "x").exists()


def test_cli_eval_prints_the_table_and_writes_the_report(test_plugins, tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text("task: {name: arithmetic, count: 5}\nengine: {name: benchmark_canned, response: '42'}\n")
    code = main(["eval", str(config), "--k", "1,2", "-o", str(tmp_path / "out"), "--no-progress",
                 "--bootstrap", "50"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    header = captured.out.splitlines()[0].split()
    assert header[:6] == ["k", "problems", "pass@k", "pass^k", "majority@k", "best_of_n@k"]
    assert (tmp_path / "out" / "eval.json").is_file() and (tmp_path / "out" / "report.html").is_file()
    assert "report: " in captured.err
    code = main(["eval", str(config), "--k", "1,x", "-o", str(tmp_path / "bad")])
    assert code == 1 and "--k: 'x' is not an integer" in capsys.readouterr().err


def test_cli_no_report_writes_none(test_plugins, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("task: {name: arithmetic, count: 3}\nengine: {name: benchmark_canned, response: '42'}\n")
    assert main(["run", str(config), "-o", str(tmp_path / "plain"), "--no-progress", "--no-report"]) == 0
    assert not (tmp_path / "plain" / "report.html").exists()
    assert main(["run", str(config), "-o", str(tmp_path / "with"), "--no-progress"]) == 0
    assert (tmp_path / "with" / "report.html").is_file()


def test_a_report_that_cannot_be_written_is_a_warning_not_a_failed_run(test_plugins, tmp_path, capsys, monkeypatch):
    import scaffold_report.build as build

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(build, "build_report", broken)
    config = tmp_path / "run.yaml"
    config.write_text("task: {name: arithmetic, count: 2}\nengine: {name: benchmark_canned, response: '42'}\n")
    assert main(["run", str(config), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: the report could not be written (OSError: disk full)" in err
    assert f"scaffold report {tmp_path / 'out'}" in err
    assert (tmp_path / "out" / "metrics.json").is_file() and not (tmp_path / "out" / "report.html").exists()


def test_k_answers_at_temperature_zero_are_warned_about(dice_plugins, dice_config, tmp_path, capsys):
    from scaffold_report.eval.command import run_eval

    run_eval(dice_config(sampling={"temperature": 0.0, "max_tokens": 16}, task={"name": "sums", "count": 2}),
             [1, 4], output_dir=tmp_path / "greedy", plugins=dice_plugins, progress=False)
    err = capsys.readouterr().err
    assert "temperature=0" in err and "4 copies of one answer" in err
    run_eval(dice_config(sampling={"temperature": 0.7, "max_tokens": 16}, task={"name": "sums", "count": 2}),
             [1, 4], output_dir=tmp_path / "sampled", plugins=dice_plugins, progress=False)
    assert "copies of one answer" not in capsys.readouterr().err


def test_a_forced_resume_with_another_verifier_rescores_the_saved_answers(eval_dir, dice_plugins, tmp_path,
                                                                         dice_config, capsys):
    import shutil

    from scaffold_report.eval.answers import read_problems
    from scaffold_report.eval.command import compute_eval

    out = tmp_path / "forced"
    shutil.copytree(eval_dir, out)
    before = {h["episode_id"]: h for h in ledger(out)}
    judge = dice_plugins.registry.create("verifier", "exact_match", {})
    run_eval(dice_config(verifier={"name": "exact_match"}), [1, 4], output_dir=out, resume=True, force_config=True,
             plugins=dice_plugins, progress=False)
    err = capsys.readouterr().err
    assert "changed the verifier (verifier.name: \"last_number\" -> \"exact_match\")" in err
    assert "re-scored the 48 saved samples of 12 episodes" in err and "every figure is the new verifier" in err
    after = ledger(out)
    changed = 0
    for head in after:
        old = before[head["episode_id"]]
        for sample, saved in zip(head["samples"], old["samples"]):
            assert sample["response"] == saved["response"]  # the answers are kept as they were
            assert sample["generated_tokens"] == saved["generated_tokens"]
            verdict = judge.verify(sample["response"], head["answer"])
            assert sample["reward"] == verdict.reward and sample["extracted"] == verdict.extracted
            assert sample["previous_verdict"]["reward"] == saved["reward"]
            changed += sample["reward"] != saved["reward"]
            answer = sample["metadata"].get("branch_answer")
            if answer is not None:  # each run's answer is its sample, re-scored
                assert answer["reward"] == sample["reward"] and answer["logprob"] == \
                    saved["metadata"]["branch_answer"]["logprob"]
    assert changed > 0  # the two verifiers disagree on some answers: the test can tell them apart
    figures = json.loads((out / "eval.json").read_text())
    assert figures["rescored"]["changes"]["verifier.name"] == {"saved": "last_number", "now": "exact_match"}
    assert figures["rescored"]["samples"] == 48 and figures["rescored"]["changed"] == changed
    # every figure is the new verifier's: the same as computed afresh from the re-scored store
    assert figures["by_k"] == compute_eval(out, [1, 4], registry=dice_plugins.registry)["by_k"]
    problems = read_problems(after)
    correct = [p.correct for p in problems.problems]
    assert figures["by_k"][0]["pass@k"]["value"] == pytest.approx(sum(c / 4 for c in correct) / 12, abs=1e-6)
    metrics = json.loads((out / "metrics.json").read_text())
    rewards = [s["reward"] for h in after for s in h["samples"] if s["reward"] is not None]
    assert metrics["reward_mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)
    exported = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["reward"] for r in exported) == sorted(s["reward"] for h in after for s in h["samples"])
    run_eval(dice_config(verifier={"name": "exact_match"}), [1], output_dir=out, resume=True, plugins=dice_plugins,
             progress=False)  # the same verifier as saved now: nothing to re-score
    assert "re-scored" not in capsys.readouterr().err
    assert "rescored" not in json.loads((out / "eval.json").read_text())


def test_the_eval_counts_answers(dice_plugins, dice_config, tmp_path, monkeypatch):
    from scaffold_report.eval.command import run_eval

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    run_eval(dice_config(task={"name": "sums", "count": 3}), [1, 4], output_dir=tmp_path / "e",
             plugins=dice_plugins, progress=None)
    assert re.search(r"^scaffold: answers 12/12 \(100%\)", log.getvalue(), re.M)


def test_a_teacher_scores_every_answer_and_the_figures_carry_the_kl_per_answer(dice_plugins, dice_config, tmp_path,
                                                                                capsys):
    from scaffold_core.teacher import Teacher, TeacherScores
    from scaffold_report.eval.command import format_table

    class Flat(Teacher):
        """Every completion token at logprob -1 (a fake teacher: the KL is the student's logprob + 1)."""

        async def _score(self, batch):
            return [TeacherScores([-1.0] * len(completion)) for _, completion in batch]

    teacher = Flat()
    out = tmp_path / "taught"
    result = run_eval(dice_config(task={"name": "sums", "count": 3}), [1, 2], output_dir=out, plugins=dice_plugins,
                      progress=False, teacher=teacher)
    kl = result.figures["teacher_kl"]
    assert teacher.stats.samples == 6 and result.figures["teacher"]["teacher_samples"] == 6
    expected, tokens = {}, {}
    with EpisodeReader(out) as reader:
        for position in range(len(reader)):
            record = reader.record(position)
            for seq in record["trajectories"]:
                generated = [(lp, t) for m, lp, t in zip(seq["loss_mask"], seq["logprobs"], seq["teacher_logprobs"])
                             if m]
                assert generated and all(t == pytest.approx(-1.0) for _, t in generated)
                expected[(record["episode_id"], seq["sample_index"])] = sum(lp + 1.0 for lp, _ in generated) / len(
                    generated)
                tokens[(record["episode_id"], seq["sample_index"])] = len(generated)
    assert kl["answers"] == 6 == len(kl["by_answer"])
    for answer in kl["by_answer"]:
        key = (answer["episode_id"], answer["sample_index"])
        assert answer["teacher_kl"] == pytest.approx(expected[key], abs=1e-5) and answer["tokens"] == tokens[key]
    assert kl["value"] == pytest.approx(sum(expected.values()) / 6, abs=1e-5)
    assert kl["max_answer"] == pytest.approx(max(expected.values()), abs=1e-5)
    assert json.loads((out / "eval.json").read_text())["teacher_kl"]["value"] == kl["value"]
    assert "teacher-student KL" in format_table(result.figures)
    from scaffold_report.build import build_report

    page = Path(build_report(out)).read_text()
    assert "teacher-student KL" in page and f"{kl['value']:.3f}" in page
    # an eval without a teacher has no such figure
    plain = run_eval(dice_config(task={"name": "sums", "count": 2}), [1], output_dir=tmp_path / "plain",
                     plugins=dice_plugins, progress=False)
    assert "teacher_kl" not in plain.figures and "teacher-student" not in format_table(plain.figures)


def test_a_teacher_with_several_workers_is_refused_before_anything_runs(dice_plugins, dice_config, tmp_path):
    with pytest.raises(ConfigError, match="--teacher scores the answers in this process"):
        run_eval(dice_config(rollout={"workers": 2}), [1], output_dir=tmp_path / "x", plugins=dice_plugins,
                 progress=False, teacher={"model": "nowhere"})


def test_the_teacher_option_is_a_model_or_a_mapping_of_options():
    from scaffold_report.commands import _teacher_option

    assert _teacher_option("runs/teacher/final") == {"model": "runs/teacher/final"}
    assert _teacher_option("{engine: vllm, url: 'http://h:8000', model: big}") == {
        "engine": "vllm", "url": "http://h:8000", "model": "big"}
    assert _teacher_option(None) is None
    with pytest.raises(ConfigError, match="--teacher: .* is neither a model"):
        _teacher_option("[1, 2]")
