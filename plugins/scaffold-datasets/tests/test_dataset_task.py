"""The built-in ``dataset`` task: rows from JSON lines, CSV, parquet or the hub; streamed; clear one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scaffold_testkit.conformance import TaskConformance

import scaffold_datasets
from scaffold_core.config import load_config
from scaffold_core.errors import ConfigError, DataError
from scaffold_core.plugins import get_plugins
from scaffold_core.run.rollout import Rollout
from scaffold_datasets.task import DatasetTask

REPO = Path(__file__).resolve().parents[3]  # the repository (its examples/)
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"


class TestDatasetTaskConformance(TaskConformance):
    """The bundled example file: rows load, prompts build, each answer passes exact_match, wrong ones do not."""

    plugin = scaffold_datasets
    name = "dataset"
    options = {"path": "json", "data_files": str(CAPITALS), "prompt": "question", "answer": "answer", "id": "code"}


class TestDatasetTaskWithMessagesConformance(TaskConformance):
    plugin = scaffold_datasets
    name = "dataset"

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path):
        path = tmp_path / "chats.jsonl"
        path.write_text("".join(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": f"{i} + {i}?"}],
                                            "answer": str(2 * i)}) + "\n" for i in range(1, 6)), encoding="utf-8")
        type(self).options = {"path": str(path), "messages": "messages", "answer": "answer"}


def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_text_prompts_get_the_system_prompt_and_ids_come_from_the_id_column():
    task = DatasetTask(path="json", data_files=str(CAPITALS), prompt="question", answer="answer", id="code",
                       system_prompt="One word.")
    rows = task.load()
    assert [r["id"] for r in rows[:3]] == ["fr", "jp", "it"]
    assert task.messages(rows[0]) == [{"role": "system", "content": "One word."},
                                      {"role": "user", "content": "What is the capital of France?"}]
    assert task.reference(rows[0]) == "Paris"


def test_a_limit_reads_only_that_many_rows_of_a_large_file(tmp_path):
    """Streaming: 10 rows of a file of 300,000 are read, and a broken record far beyond them is never parsed."""
    path = tmp_path / "big.jsonl"
    line = json.dumps({"q": "x" * 40, "a": "1"}) + "\n"
    with path.open("w", encoding="utf-8") as fh:
        fh.write(line * 300_000)  # ~16 MB: more than the json reader's first block
        fh.write("{this is not json\n")
    task = DatasetTask(path="json", data_files=str(path), prompt="q", answer="a", limit=10)
    assert len(task.load()) == 10
    assert task.rows_read == 10
    with pytest.raises(DataError, match=r"could not read .*big\.jsonl as json"):
        DatasetTask(path="json", data_files=str(path), prompt="q", answer="a").load()


def test_csv_and_parquet_files_and_a_split_mapping(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv = tmp_path / "qa.csv"
    csv.write_text("question,answer\nTwo plus two?,4\nThree plus three?,6\n", encoding="utf-8")
    rows = DatasetTask(path="csv", data_files=str(csv), prompt="question", answer="answer").load()
    assert [(r["prompt"], r["answer"]) for r in rows] == [("Two plus two?", 4), ("Three plus three?", 6)]
    parquet = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"text": ["a?", "b?"], "gold": ["A", "B"]}), parquet)
    task = DatasetTask(path="parquet", data_files={"train": str(parquet)}, split="train", prompt="text", answer="gold")
    assert [(r["prompt"], r["answer"], r["id"]) for r in task.load()] == [("a?", "A", "train-0"),
                                                                          ("b?", "B", "train-1")]


def test_shuffle_is_seeded_and_limit_applies_after_it():
    def ids(seed):
        task = DatasetTask(path=str(CAPITALS), prompt="question", id="code", shuffle=True, seed=seed, limit=5)
        return [r["id"] for r in task.load()]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2) or ids(1) != ids(3)
    assert len(ids(1)) == 5 and len(set(ids(1))) == 5


def test_empty_prompts_and_duplicate_ids_are_skipped_and_counted(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "q": "one?"}, {"id": "b", "q": "  "},
                                               {"id": "a", "q": "again?"}, {"id": "c", "q": "three?"}])
    task = DatasetTask(path=str(path), prompt="q", id="id")
    assert [r["id"] for r in task.load()] == ["a", "c"]
    assert task.skipped == {"empty prompt": 1, "duplicate id": 1}


@pytest.mark.parametrize("options, message", [
    ({"prompt": "query"},
     r"^task\.prompt: column 'query' is not in .*d\.jsonl \(its columns: q, a\); set task\.prompt"),
    ({"prompt": "q", "answer": "gold"}, r"^task\.answer: column 'gold' is not in .*d\.jsonl"),
    ({"prompt": "q", "id": "key"}, r"^task\.id: column 'key' is not in"),
    ({"messages": "chat"}, r"^task\.messages: column 'chat' is not in"),
])
def test_a_missing_column_is_one_line_naming_the_file_and_column(tmp_path, options, message):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"q": "one?", "a": "1"}])
    with pytest.raises(DataError, match=message) as info:
        DatasetTask(path="json", data_files=str(path), **options).load()
    assert "\n" not in str(info.value)


def test_empty_and_unreadable_files_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.jsonl has no rows in split 'test'"):
        DatasetTask(path=str(empty), prompt="q").load()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"q": "fine"}\n{"q": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"^task\.data_files: could not read .*broken\.jsonl as json") as info:
        DatasetTask(path=str(broken), prompt="q").load()
    assert "\n" not in str(info.value)
    unusable = _write_jsonl(tmp_path / "blank.jsonl", [{"q": ""}, {"q": None}])
    with pytest.raises(DataError, match=r"no usable rows .*2 empty prompt"):
        DatasetTask(path=str(unusable), prompt="q").load()


def test_bad_options_fail_when_the_config_is_built(tmp_path):
    registry = get_plugins().registry

    def build(**options):
        return registry.create("task", "dataset", options, path="task")

    with pytest.raises(ConfigError, match="not both"):
        build(path=str(CAPITALS), prompt="question", messages="question")
    with pytest.raises(ConfigError, match="task.encoding: 'klingon' is not a text encoding"):
        build(path=str(CAPITALS), prompt="question", encoding="klingon")
    with pytest.raises(ConfigError, match="task.sep is CSV's column separator"):
        build(path=str(CAPITALS), prompt="question", sep=";")
    with pytest.raises(ConfigError, match="missing.jsonl does not exist"):
        build(path="json", data_files=str(tmp_path / "missing.jsonl"), prompt="q")
    with pytest.raises(ConfigError, match="set task.data_files"):
        build(path="csv", prompt="q")
    with pytest.raises(ConfigError, match="split 'test' is not in task.data_files"):
        build(path="json", data_files={"train": str(CAPITALS)}, prompt="question")


def test_a_hub_dataset_that_cannot_be_reached_is_a_one_line_error(tmp_path):
    """Offline (as here), a hub id fails with one line saying what to do, not a traceback."""
    code = ("from scaffold_datasets.task import DatasetTask\n"
            "from scaffold_core.errors import DataError\n"
            "try:\n    DatasetTask(path='nobody-here/no-such-dataset', prompt='q').load()\n"
            "except DataError as exc:\n    print(exc)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout + out.stderr
    assert lines[0].startswith("task.path: could not load the dataset 'nobody-here/no-such-dataset'")
    assert "point the task at local files" in lines[0]


def test_the_example_config_runs_on_its_bundled_file(tmp_path, monkeypatch):
    """examples/dataset-jsonl.yaml, as written, on the canned engine: four rows, the right answer rewarded."""
    monkeypatch.chdir(REPO)
    plugins = get_plugins()
    config = load_config(REPO / "examples" / "dataset-jsonl.yaml",
                         ["engine.name=benchmark_canned", "engine.response=paris", "rollout.progress=false"],
                         registry=plugins.registry)
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=plugins).run()
    assert (metrics["episodes"], metrics["completed"], metrics["failed"]) == (4, 4, 0)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["reward"] for s in samples) == [0.0, 0.0, 0.0, 1.0]


# -- every shape of chat data ------------------------------------------------------------------------------------


def test_trl_conversational_prompt_completion_rows_score(tmp_path, capfd):
    """TRL's conversational prompt/completion rows: the prompt is messages, the completion's assistant text is the
    reference (not a list of message dicts the verifier cannot read), and a run scores them."""
    path = _write_jsonl(tmp_path / "trl.jsonl", [
        {"prompt": [{"role": "user", "content": f"Capital of {c}?"}],
         "completion": [{"role": "assistant", "content": city}]}
        for c, city in (("France", "Paris"), ("Peru", "Lima"))])
    task = DatasetTask(path=str(path), prompt="prompt", answer="completion")
    rows = task.load()
    assert task.messages(rows[0]) == [{"role": "user", "content": "Capital of France?"}]
    assert [task.reference(r) for r in rows] == ["Paris", "Lima"]
    assert "column 'completion' holds chat messages ({role, content}): the assistant's text" in capfd.readouterr().err
    config = load_config(data={"task": {"name": "dataset", "path": str(path)},  # columns detected
                               "engine": {"name": "benchmark_canned", "response": "Paris"}})
    metrics = Rollout(config, output_dir=tmp_path / "run", progress=False).run()
    assert (metrics["completed"], metrics["failed"], metrics["reward_mean"]) == (2, 0, 0.5)
    assert "detected column 'prompt' holds TRL conversational prompts" in capfd.readouterr().err


def test_a_conversation_ending_with_the_answer_keeps_it_out_of_the_prompt(tmp_path, capfd):
    path = _write_jsonl(tmp_path / "chats.jsonl", [
        {"messages": [{"role": "system", "content": "One word."}, {"role": "user", "content": "Capital of Chile?"},
                      {"role": "assistant", "content": "Santiago"}]},
        {"messages": [{"role": "user", "content": "Capital of Cuba?"}, {"role": "assistant", "content": ""}]},
        {"messages": [{"role": "user", "content": "Capital of Mali?"}]}])
    task = DatasetTask(path=str(path))
    rows = task.load()
    said = capfd.readouterr().err
    assert "detected column 'messages' holds chat messages ({role, content})" in said
    assert "each row's last assistant message is its answer, never shown to the model" in said
    assert task.messages(rows[0]) == [{"role": "system", "content": "One word."},
                                      {"role": "user", "content": "Capital of Chile?"}]
    assert task.reference(rows[0]) == "Santiago" and "Santiago" not in json.dumps(task.messages(rows[0]))
    assert task.skipped == {"empty answer": 1}  # never an episode scored 0 for want of an answer
    assert task.reference(rows[1]) is None  # a question with no answer at all: unscored, below


def test_a_row_with_no_answer_is_never_scored_0(tmp_path):
    path = _write_jsonl(tmp_path / "open.jsonl", [{"question": "Capital of Chad?", "answer": None},
                                                   {"question": "Capital of Togo?", "answer": "Lome"},
                                                   {"question": "Capital of Fiji?"}])
    config = load_config(data={"task": {"name": "dataset", "path": str(path), "prompt": "question"},
                               "engine": {"name": "benchmark_canned", "response": "Lome"}})
    metrics = Rollout(config, output_dir=tmp_path / "run", progress=False).run()
    assert metrics["completed"] == 3 and metrics["unscored_samples"] == 3  # no answer column: none is a 0
    answered = load_config(data={"task": {"name": "dataset", "path": str(path), "prompt": "question",
                                          "answer": "answer"},
                                 "engine": {"name": "benchmark_canned", "response": "Lome"}})
    metrics = Rollout(answered, output_dir=tmp_path / "run2", progress=False).run()
    assert metrics["completed"] == 1 and metrics["reward_mean"] == 1.0
    assert metrics["skipped_rows"] == {"empty answer": 2}


def test_sharegpt_and_content_parts_are_read_as_chat_messages(tmp_path):
    sharegpt = _write_jsonl(tmp_path / "sharegpt.jsonl", [
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2 + 2?"},
                           {"from": "gpt", "value": "4"}]}])
    task = DatasetTask(path=str(sharegpt))
    rows = task.load()
    assert task.messages_column == "conversations" and "ShareGPT {from, value}" in (task.detected or "")
    assert task.messages(rows[0]) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    assert task.reference(rows[0]) == "4"
    parts = _write_jsonl(tmp_path / "parts.jsonl", [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "3 + "}, {"type": "text", "text": "3?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "6"}]}]}])
    task = DatasetTask(path=str(parts), messages="messages")
    rows = task.load()
    assert task.messages(rows[0]) == [{"role": "user", "content": "3 + 3?"}] and task.reference(rows[0]) == "6"


def test_encoding_and_separator_read_files_that_are_not_utf8_csv(tmp_path):
    latin = tmp_path / "capitals.tsv"
    latin.write_bytes("question\tanswer\nCapital of Colombia?\tBogotá\n".encode("latin-1"))
    task = DatasetTask(path=str(latin), prompt="question", answer="answer", encoding="latin-1")
    assert [task.reference(r) for r in task.load()] == ["Bogotá"]  # .tsv: tab-separated, unless sep says otherwise
    semi = tmp_path / "capitals.csv"
    semi.write_text("question;answer\nCapital of Spain?;Madrid\n", encoding="utf-8")
    task = DatasetTask(path=str(semi), prompt="question", answer="answer", sep=";")
    assert [task.reference(r) for r in task.load()] == ["Madrid"]
