"""The gsm8k task: sources, options, skipped rows, prompts, and the defaults it gives a run."""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction

import pytest
from scaffold_testkit import ScriptedEngine, plugin_set

import scaffold_gsm8k
from scaffold_core import hookimpl
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError
from scaffold_core.run.rollout import Rollout
from scaffold_core.tokenizers import ByteTokenizer
from scaffold_gsm8k import data
from scaffold_gsm8k.answers import canonical_number
from scaffold_gsm8k.task import GSM8KTask


@pytest.fixture(scope="module")
def registry():
    return plugin_set(gsm8k=scaffold_gsm8k).registry


def build_task(registry, options):
    """What `scaffold run` does before any model loads: validate the config, then build the task."""
    config = load_config(data={"task": {"name": "gsm8k", **options}, "engine": {"name": "benchmark_canned"}},
                         registry=registry)
    return registry.create("task", "gsm8k", config.task.options, path="task")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


# -- the bundled sample ---------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(node):
    """Evaluate + - * / on numbers exactly (our own sample data only; never model text)."""
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError(f"unexpected expression {ast.dump(node)}")


@pytest.mark.parametrize("split, at_least", [("test", 30), ("train", 8)])
def test_bundled_sample_is_well_formed_and_its_arithmetic_is_right(split, at_least):
    records = data.read_sample(split)
    assert len(records) >= at_least
    assert len({r["question"] for r in records}) == len(records)
    for record in records:
        assert record["answer"].count("####") == 1 and record["answer"].rstrip().splitlines()[-1].startswith("#### ")
        for expr, shown in re.findall(r"<<([^=<>]+)=([^<>]+)>>", record["answer"]):
            assert _arith(ast.parse(expr, mode="eval")) == Fraction(shown), (record["question"], expr)
        canonical_number(record["answer"].rsplit("####", 1)[1])


def test_sample_and_hub_test_splits_share_no_question():
    test = {r["question"] for r in data.read_sample("test")}
    train = {r["question"] for r in data.read_sample("train")}
    assert not test & train


def test_sample_rows():
    task = GSM8KTask(source="sample")
    rows = task.load()
    assert len(rows) == len(data.read_sample("test"))
    assert rows[0]["id"] == "test-0" and rows[-1]["id"] == f"test-{len(rows) - 1}"
    assert not task.skipped
    by_id = {row["id"]: row for row in rows}
    assert task.reference(by_id["test-16"]) == "-3"     # negative gold answers survive
    assert task.reference(by_id["test-18"]) == "1,650"  # as written; the verifier normalises


def test_limit_shuffle_and_seed():
    everything = [r["id"] for r in GSM8KTask(source="sample").load()]
    assert [r["id"] for r in GSM8KTask(source="sample", limit=5).load()] == everything[:5]
    shuffled = [r["id"] for r in GSM8KTask(source="sample", shuffle=True, seed=1).load()]
    assert sorted(shuffled) == sorted(everything) and shuffled != everything
    assert shuffled == [r["id"] for r in GSM8KTask(source="sample", shuffle=True, seed=1).load()]
    assert shuffled != [r["id"] for r in GSM8KTask(source="sample", shuffle=True, seed=2).load()]
    # ids name the row, not its position after shuffling: a resumed run finds the same episodes
    first = GSM8KTask(source="sample", shuffle=True, seed=1, limit=3).load()
    assert [r["id"] for r in first] == shuffled[:3]


# -- local files -----------------------------------------------------------------


def test_bad_rows_are_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [
        {"question": "Q1?", "answer": "1 + 1 = 2\n#### 2"},
        {"question": "", "answer": "#### 3"},
        {"answer": "#### 3"},
        {"question": "Q4?", "answer": "#### four"},
        {"question": "Q5?", "answer": "no marker and no number"},
        {"question": "Q6?", "answer": None},
        {"question": "Q7?", "answer": "#### 1,234"},
        {"question": "Q8?", "answer": "18"},
        {"question": "Q9?", "answer": "#### 5 or 6"},
    ])
    task = GSM8KTask(data_files=path, cache_dir=str(tmp_path / "cache"))
    rows = task.load()
    assert [r["id"] for r in rows] == ["test-0", "test-6", "test-7"]
    assert [task.reference(r) for r in rows] == ["2", "1,234", "18"]
    assert task.skipped == Counter({"missing question": 2, "answer without a number": 3, "missing answer": 1})
    task.load()  # loading again does not count twice
    assert sum(task.skipped.values()) == 6


def test_limit_stops_reading_at_the_limit(tmp_path):
    good = [{"question": f"Q{i}?", "answer": f"#### {i}"} for i in range(3)]
    path = write_jsonl(tmp_path / "rows.jsonl", good[:1] + [{"question": ""}] + good[1:] + [{"answer": "#### 1"}] * 5)
    task = GSM8KTask(data_files=path, limit=2, cache_dir=str(tmp_path / "cache"))
    assert [r["id"] for r in task.load()] == ["test-0", "test-2"]
    assert task.skipped == Counter({"missing question": 1})  # the rows after the second usable one are not read
    task = GSM8KTask(data_files=path, cache_dir=str(tmp_path / "cache"))
    assert len(task.load()) == 3 and task.skipped == Counter({"missing question": 6})
    shuffled = GSM8KTask(data_files=path, limit=2, shuffle=True, cache_dir=str(tmp_path / "cache"))
    assert len(shuffled.load()) == 2 and shuffled.skipped == Counter({"missing question": 6})  # shuffling reads all


def test_record_ids_are_kept_and_duplicates_skipped(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [
        {"id": "a", "question": "Q?", "answer": "#### 1"},
        {"id": "a", "question": "Q again?", "answer": "#### 2"},
        {"id": 7, "question": "Q?", "answer": "#### 3"},
    ])
    task = GSM8KTask(data_files=path, cache_dir=str(tmp_path / "cache"))
    assert [r["id"] for r in task.load()] == ["a", "7"]
    assert task.skipped == Counter({"duplicate id": 1})


def test_parquet_files_and_split_mappings(tmp_path):
    import datasets

    records = [{"question": f"What is {n} + {n}?", "answer": f"{n} + {n} = {2 * n}\n#### {2 * n}"} for n in range(4)]
    datasets.Dataset.from_list(records).to_parquet(str(tmp_path / "train.parquet"))
    test_path = write_jsonl(tmp_path / "test.jsonl", records[:2])
    files = {"train": str(tmp_path / "train.parquet"), "test": test_path}
    train = GSM8KTask(data_files=files, split="train", cache_dir=str(tmp_path / "cache")).load()
    assert [r["gold"] for r in train] == ["0", "2", "4", "6"]
    assert len(GSM8KTask(data_files=files, cache_dir=str(tmp_path / "cache")).load()) == 2


@pytest.mark.parametrize("options, message", [
    ({"data_files": "missing.jsonl"}, "missing.jsonl does not exist"),
    ({"data_files": "rows.csv"}, "neither .jsonl, .json nor .parquet"),
    ({"data_files": {"train": "t.jsonl"}}, "data_files has no split 'test'"),
    ({"source": "sample", "split": "validation"}, "its splits are: test, train"),
    ({"source": "sample", "data_files": "x.jsonl"}, "not both"),
    ({"source": "sample", "limit": 0}, "task.limit: Input should be greater than or equal to 1; got 0"),
    ({"source": "sample", "few_shot": -1}, "task.few_shot: Input should be greater than or equal to 0; got -1"),
    ({"source": "sample", "instruction": "Solve it."}, "must contain {question}"),
    ({"source": "sample", "few_shot_file": "nope.jsonl"}, "nope.jsonl does not exist"),
    ({"source": "somewhere"}, "task.source"),
    ({"source": "sample", "limit": "ten"}, "task.limit"),
    ({"source": "sample", "shuffel": True}, "Did you mean 'shuffle'"),
])
def test_bad_options_fail_before_anything_loads(registry, tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_task(registry, options)


def test_few_shot_with_data_files_needs_a_train_split(registry, tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [{"question": "Q?", "answer": "#### 1"}])
    with pytest.raises(ConfigError, match="few_shot needs worked examples"):
        build_task(registry, {"data_files": path, "few_shot": 2})


def test_unreadable_file_names_the_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(data.DataSourceError, match="broken.jsonl"):
        GSM8KTask(data_files=str(path), cache_dir=str(tmp_path / "cache")).load()


# -- the hub ---------------------------------------------------------------------


def test_hub_source_asks_datasets_for_openai_gsm8k_main(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_list([{"question": "Q?", "answer": "#### 5"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = GSM8KTask(split="train").load()
    assert calls == [(("openai/gsm8k", "main"), {"split": "train", "cache_dir": None})]
    assert rows == [{"id": "train-0", "question": "Q?", "answer": "#### 5", "gold": "5"}]


def test_hub_offline_error_says_how_to_work_offline(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataSourceError) as info:
        GSM8KTask().load()
    message = str(info.value)
    assert "openai/gsm8k" in message and "data_files" in message and "source: sample" in message


# -- prompts -----------------------------------------------------------------------


def test_messages_ask_for_steps_and_the_marker():
    task = GSM8KTask(source="sample", limit=1)
    row = task.load()[0]
    messages = task.messages(row)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert row["question"] in messages[1]["content"] and "####" in messages[1]["content"]
    prompt = task.build_prompt(row, ByteTokenizer())
    assert prompt.text.startswith("<|system|>") and prompt.text.endswith("<|assistant|>\n")
    assert prompt.ids == ByteTokenizer().encode(prompt.text)


def test_system_prompt_and_instruction_are_configurable():
    task = GSM8KTask(source="sample", limit=1, system_prompt=None, instruction="Q: {question}\nA (end with ####):")
    row = task.load()[0]
    assert task.messages(row) == [{"role": "user", "content": f"Q: {row['question']}\nA (end with ####):"}]


def test_few_shot_examples_come_from_the_train_split():
    task = GSM8KTask(source="sample", limit=2, few_shot=3, seed=4)
    rows = task.load()
    train = {r["question"]: r["answer"] for r in data.read_sample("train")}
    for row in rows:
        messages = task.messages(row)
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3 + ["user"]
        shots = messages[1:-1]
        for user, assistant in zip(shots[::2], shots[1::2]):
            question = next(q for q in train if q in user["content"])
            assert "<<" not in assistant["content"]  # calculator annotations are stripped
            assert assistant["content"].endswith(train[question].rsplit("\n", 1)[1])
    assert task.messages(rows[0]) == task.messages(rows[0])  # the same examples every time


def test_few_shot_never_shows_the_question_being_asked():
    task = GSM8KTask(source="sample", split="train", few_shot=7)
    for row in task.load():
        shown = " ".join(m["content"] for m in task.messages(row)[1:-1])
        assert row["question"] not in shown
        assert len(task.messages(row)) == 1 + 2 * 7 + 1


def test_few_shot_file(tmp_path):
    path = write_jsonl(tmp_path / "shots.jsonl", [{"question": "Shot?", "answer": "a <<1+1=2>>2\n#### 2"}])
    task = GSM8KTask(source="sample", limit=1, few_shot=1, few_shot_file=path, cache_dir=str(tmp_path / "c"))
    messages = task.messages(task.load()[0])
    assert messages[2] == {"role": "assistant", "content": "a 2\n#### 2"}
    too_many = GSM8KTask(source="sample", few_shot=2, few_shot_file=path, cache_dir=str(tmp_path / "c"))
    with pytest.raises(data.DataSourceError, match="2 examples asked for"):
        too_many.load()


# -- defaults reach the engine -------------------------------------------------------


class _Engines:
    """A plugin registering a scripted engine whose instances the test can inspect."""

    def __init__(self, respond):
        self.respond = respond
        self.made: list[ScriptedEngine] = []

    @hookimpl
    def register_engines(self, registry):
        def scripted() -> ScriptedEngine:
            engine = ScriptedEngine(self.respond)
            self.made.append(engine)
            return engine

        registry.add("scripted", scripted)


def _run(tmp_path, respond, **sections):
    engines = _Engines(respond)
    plugins = plugin_set(gsm8k=scaffold_gsm8k, engines=engines)
    raw = {"task": {"name": "gsm8k", "source": "sample", "limit": 4}, "engine": {"name": "scripted"},
           "rollout": {"progress": False}, **sections}
    config = load_config(data=raw, registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    return engines.made[-1], metrics  # the last one built: load_config builds one to validate


def test_task_defaults_reach_the_engine_explicitly(tmp_path):
    engine, metrics = _run(tmp_path, "#### 1")
    assert len(engine.requests) == 4
    assert {(r.sampling.max_tokens, r.sampling.temperature) for r in engine.requests} == {(512, 1.0)}
    assert metrics["completed"] == 4


def test_config_sampling_overrides_task_defaults(tmp_path):
    engine, _ = _run(tmp_path, "#### 1", sampling={"max_tokens": 64, "temperature": 0.0})
    assert {(r.sampling.max_tokens, r.sampling.temperature) for r in engine.requests} == {(64, 0.0)}


def test_a_run_scores_with_the_gsm8k_verifier_by_default(tmp_path):
    golds = {r["question"]: r["answer"].rsplit("####", 1)[1].strip() for r in data.read_sample("test")}

    def respond(prompt, request):
        question = next(q for q in golds if q in prompt)
        return f"Working...\n#### {golds[question]}" if "Mara" in question or "Leo" in question else "#### -1"

    _, metrics = _run(tmp_path, respond)
    assert metrics["reward_mean"] == 0.5 and metrics["failed"] == 0
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["reason"] for s in samples} >= {"correct (####)"}
    assert all(s["answer"] == golds[next(q for q in golds if q in s["prompt"])] for s in samples)


@pytest.mark.parametrize("task, controller", [("multiturn_gsm8k", "multiturn_chat"), ("gsm8k_calculator", "agent")])
def test_the_multiturn_tasks_name_what_they_run_on_and_where_it_comes_from(registry, task, controller):
    """Nothing of scaffold-multiturn is imported: without it, a run of these tasks says what to install."""
    with pytest.raises(ConfigError) as info:
        load_config(data={"task": {"name": task, "source": "sample"}}, registry=registry)
    message = str(info.value)
    assert f"unknown controller {controller!r}" in message
    assert "docs/plugins.md lists which package adds which component" in message
    multiturn = pytest.importorskip("scaffold_multiturn")
    tools = pytest.importorskip("scaffold_tools")
    both = plugin_set(gsm8k=scaffold_gsm8k, multiturn=multiturn, tools=tools).registry
    config = load_config(data={"task": {"name": task, "source": "sample"}}, registry=both)
    assert (config.controller.name, config.trajectory.name, config.verifier.name) == (controller, "multiturn", "gsm8k")
