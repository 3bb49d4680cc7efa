"""Bad input is rejected clearly and early; fuzzed configs and dataset rows never crash scaffold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaffold_core.config import SECTIONS, load_config
from scaffold_core.errors import ConfigError
from scaffold_core.output import safe_child
from scaffold_core.output.store import count_episodes

# Runs `scaffold run` in-process, then reports whether torch was ever imported (i.e. a model loaded).
RUN_AND_REPORT = """
import sys
from scaffold_core.cli import main
code = main(sys.argv[1:])
print("EXIT", code, "TORCH", "torch" in sys.modules)
"""


def run_reporting(*args: str, cwd) -> tuple[int, bool, str]:
    proc = subprocess.run([sys.executable, "-c", RUN_AND_REPORT, *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)
    last = proc.stdout.strip().splitlines()[-1].split()
    return int(last[1]), last[3] == "True", proc.stderr


def test_config_errors_stop_the_run_before_any_model_loads(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: gsm8k, source: sample, limit: 2}\nengine: {name: transformers, dtype: float8}\n")
    code, torch_loaded, err = run_reporting("run", str(config), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert code == 1 and not torch_loaded
    assert "engine" in err and "float8" in err
    assert not (tmp_path / "out").exists()


def test_unusable_rows_fail_before_any_model_loads_when_asked(tmp_path):
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"},
        {"question": "", "answer": "#### 3"},
        {"question": "How many?", "answer": "many"},
    ]) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"task: {{name: gsm8k, data_files: {data}}}\nrollout: {{bad_rows: fail}}\n")
    code, torch_loaded, err = run_reporting("run", str(config), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert code == 1 and not torch_loaded
    assert "2 dataset rows are unusable" in err and "rollout.bad_rows: skip" in err


def test_skipped_rows_are_counted_in_metrics(tmp_path):
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"question": "What is 1 + 1?", "answer": "#### 2"},
        {"question": "Broken", "answer": "no number here"},
    ]) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"task: {{name: gsm8k, data_files: {data}}}\n"
                      "engine: {name: benchmark_canned, response: '#### 2'}\n")
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "run", str(config), "-o", str(tmp_path / "o"),
                           "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["completed"] == 1 and sum(metrics["skipped_rows"].values()) == 1


def test_sigterm_stops_gracefully_like_ctrl_c(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: gsm8k, source: sample}\n"
                      "engine: {name: benchmark_canned, response: '#### 1', delay_s: 0.2}\n"
                      "rollout: {concurrency: 2}\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "run", str(config), "-o", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for _ in range(300):
            if count_episodes(out / "episodes.db") >= 2:
                break
            assert proc.poll() is None, proc.communicate()
            __import__("time").sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and "SIGTERM received" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interrupted"] == "SIGTERM" and metrics["failed"] == 0 and metrics["completed"] >= 2


def test_output_files_cannot_escape_the_output_dir(tmp_path):
    assert safe_child(tmp_path, "episodes.jsonl") == (tmp_path / "episodes.jsonl").resolve()
    for bad in ("../outside.jsonl", "/etc/passwd", "a/../../b"):
        with pytest.raises(ValueError, match="escapes the output directory"):
            safe_child(tmp_path, bad)


# -- fuzzing -----------------------------------------------------------------

KEYS = ["name", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "concurrency", "workers",
        "retries", "dir", "limit", "samples", "source", "split", "timeout", "launcher", "bad_rows", "mode",
        "response", "overwrite", "generator"]
NAMES = ["gsm8k", "native", "majority_vote", "best_of_n", "benchmark_canned", "transformers", "exact_match",
         "single_turn", "grpo", "nope", "", "GSM8K"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(NAMES))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
                      max_leaves=6)
sections = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
configs = st.dictionaries(st.sampled_from([*SECTIONS, "sampling_params", "plugins"]),
                          st.one_of(sections, scalars), max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_fuzzed_configs_either_load_or_raise_a_config_error(data):
    try:
        config = load_config(data=data)
    except ConfigError as exc:
        assert str(exc).strip()  # always a message
        return
    yaml.safe_load(config.to_yaml())  # a config that loads always round-trips


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["question", "answer", "id", "extra"]),
                    st.one_of(st.none(), st.integers(), st.text(max_size=40), st.lists(st.text(max_size=5), max_size=2),
                              st.sampled_from(["#### 12", "It is 3.\n#### 1,000", "####", "#### -2.50", "x ####"])),
                    max_size=4),
    st.text(max_size=10), st.integers()), max_size=12))
def test_fuzzed_dataset_rows_are_kept_or_skipped_never_fatal(records):
    from scaffold_gsm8k.task import GSM8KTask

    skipped: Counter[str] = Counter()
    seen: set[str] = set()
    kept = [r for i, rec in enumerate(records)
            if (r := GSM8KTask.make_row(rec, i, "test", skipped, seen)) is not None]
    assert len(kept) + sum(skipped.values()) == len(records)
    for row in kept:
        assert row["question"].strip() and row["id"]
        assert GSM8KTask().reference(row) is not None


# -- a finished run that failed says so ----------------------------------------------------------------


def in_process(*args: str) -> tuple[int, str, str]:
    """``scaffold ARGS`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from scaffold_core import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return int(code), out.getvalue(), err.getvalue()



def list_config(path, good: int, bad: int):
    rows = [{"id": f"g{i}", "question": "q", "answer": "42"} for i in range(good)]
    rows += [{"id": f"b{i}", "answer": "42"} for i in range(bad)]  # no question: building the prompt fails
    path.write_text(yaml.safe_dump({"task": {"name": "list", "rows": rows},
                                    "engine": {"name": "benchmark_canned", "response": "42"},
                                    "output": {"save_dataset": False}}))
    return path


def test_a_run_where_every_episode_failed_exits_non_zero_and_says_why(test_plugins, tmp_path):
    from scaffold_core.run.summary import ExitCode

    config = tmp_path / "c.yaml"
    config.write_text("task: {name: arithmetic, count: 5}\n"
                      "engine: {name: benchmark_canned, response: '#### 42', delay_s: 1}\n"
                      "rollout: {request_timeout: 0.05}\noutput: {save_dataset: false}\n")
    code, stdout, err = in_process("run", str(config), "-o", str(tmp_path / "out"), "--no-progress", "--json")
    assert code == ExitCode.ALL_FAILED == 3
    assert "5 of 5 episodes failed (100%)" in err and "every episode failed: exit code 3" in err
    cause, = json.loads(stdout)["top_failure_causes"]
    assert cause["component"] == "engine" and cause["count"] == 5 and "request_timeout" in cause["error"]
    assert f"5 x engine: {cause['error']}" in err


def test_a_run_above_max_failed_fraction_exits_non_zero_with_the_top_causes(test_plugins, tmp_path):
    from scaffold_core.run.summary import ExitCode

    config = list_config(tmp_path / "c.yaml", good=2, bad=3)
    code, _, err = in_process("run", str(config), "-o", str(tmp_path / "a"), "--no-progress")
    assert code == ExitCode.TOO_MANY_FAILED == 4
    assert "3 of 5 episodes failed (60%)" in err and "more than rollout.max_failed_fraction=0.5" in err
    assert "3 x task: building the prompt failed: KeyError: 'question'" in err
    code, _, err = in_process("run", str(config), "-o", str(tmp_path / "b"), "--no-progress",
                              "--set", "rollout.max_failed_fraction=0.8")
    assert code == ExitCode.OK and "3 of 5 episodes failed" in err
    code, _, _ = in_process("run", str(list_config(tmp_path / "ok.yaml", good=3, bad=0)), "-o", str(tmp_path / "c"),
                            "--no-progress")
    assert code == ExitCode.OK


# -- tracebacks become one-line errors: file, line, fix ------------------------------------------------


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_bytes_that_are_not_utf8_are_one_line_errors_naming_file_line_and_fix(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"question": "What is 1 + 1?", "answer": "#### 2"}\n'
                     b'{"question": "Wh\xe9t?", "answer": "#### 3"}\n')
    config = tmp_path / "c.yaml"
    config.write_text(f"task: {{name: gsm8k, data_files: {data}}}\nengine: {{name: benchmark_canned}}\n")
    code, _, err = in_process("run", str(config), "-o", str(tmp_path / "out"), "--no-progress")
    line = one_error_line(err)
    assert code == 1 and f"{data}:2: not UTF-8 (byte 0xe9 at column 17)" in line and "iconv" in line

    scores = tmp_path / "in.jsonl"
    scores.write_bytes(b'{"response": "42", "answer": "42"}\n\n{"response": "4\xff2", "answer": "42"}\n')
    code, _, err = in_process("score", "--verifier", "exact_match", "--input", str(scores))
    assert code == 1 and f"{scores}:3: not UTF-8 (byte 0xff at column 16)" in one_error_line(err)

    bad_config = tmp_path / "bad.yaml"
    bad_config.write_bytes(b"task: {name: gsm8k}\nsampling: {stop: ['\xff']}\n")
    code, _, err = in_process("run", str(bad_config), "-o", str(tmp_path / "out2"))
    assert code == 1 and f"{bad_config}:2: not UTF-8" in one_error_line(err)


def test_score_scores_every_other_row_and_reports_bad_gold_values_by_line(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in [
        {"response": "So #### 5", "answer": "5", "id": "a"},
        {"response": "So #### 6", "answer": "not a number", "id": "b"},
        {"response": "So #### 7", "answer": "8", "id": "c"},
        {"response": "So #### 9", "answer": {"nested": 9}, "id": "d"},
    ]) + "\n")
    target = tmp_path / "scored.jsonl"
    code, stdout, err = in_process("score", "--verifier", "gsm8k", "--input", str(source), "--output", str(target))
    assert code == 1 and "Traceback" not in err
    summary = json.loads(stdout)
    assert summary["lines"] == 4 and summary["scored"] == 2 and summary["correct"] == 1
    assert [u["line"] for u in summary["unscored"]] == [2, 4]
    assert f"error: {source}:2: not scored: " in err and "not a number" in err and f"error: {source}:4:" in err
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]  # every row kept, in order
    assert [r["reward"] for r in rows] == [1.0, None, 0.0, None] and "unusable" in rows[1]["error"]
