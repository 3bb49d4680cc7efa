"""The ledger and the files derived from it, written and read in bounded memory, have the content the
in-memory path gives: the same ledger lines, records, samples, failures, dataset rows and metrics."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pytest

from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output import codec
from scaffold_core.output.derived import write_derived
from scaffold_core.output.ledger import completed_ids, latest_records, ledger_line, read_head, record_of, result_of
from scaffold_core.output.ledger_index import LedgerChanged, LedgerIndex
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.run.finalize import finalize_run_dir
from scaffold_core.run.metrics import RunMetrics
from scaffold_core.trajectory import TrainingSample
from scaffold_core.verifier import Verdict


def as_json(text: bytes | str):
    """Parsed with the standard library, NaN kept comparable (NaN != NaN)."""
    return json.loads(text, parse_constant=lambda name: f"<{name}>")


@dataclass
class Extra:
    x: int = 1


@dataclass(slots=True)
class TurnSample(TrainingSample):
    turn_rewards: list[float] = field(default_factory=list)


@dataclass(slots=True)
class RenamedSample(TrainingSample):
    def to_dict(self):
        return {"ids": self.input_ids, "reward": self.reward}


def training(cls=TrainingSample, **changes):
    fields = dict(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[-1, 0, 0],
                  reward=1.0, advantage=0.5, episode_id="e", sample_index=0, group_id="e", prompt_len=1,
                  finish_reason="stop")
    return cls(**{**fields, **changes})


def row(**changes):
    sample = training()
    return {**{name: getattr(sample, name) for name in TrainingSample.__slots__}, **changes}


def result(eid="e", index=0, status="ok", trajectories=None, metadata=None, reward=1.0, metrics=None):
    sample = Sample([1], [2, 3], [-0.5, -0.25], [1, 1], "so 42", "stop", 0, 0,
                    Verdict(reward, "42", "42", "match"), metadata=metadata or {})
    return EpisodeResult(eid, index, status, reference="42", prompt_text="Q?",
                         samples=[sample] if status == "ok" else [], metrics=metrics or {},
                         error=None if status == "ok" else "engine raised",
                         error_component=None if status == "ok" else "engine",
                         trajectories=[training()] if trajectories is None else trajectories)


@pytest.mark.parametrize("case", [
    result(),
    result(trajectories=[training(TurnSample, turn_rewards=[0.5, 1.0])]),
    result(trajectories=[training(RenamedSample)]),
    result(trajectories=[training(logprobs=[0.0, float("nan"), -math.inf])]),
    result(reward=float("inf"), metrics={"maj@4": float("nan")}),
    result(metadata={"big": 2 ** 70, "nested": {"k": [1, None, 2.5]}}),
    result(metadata={3: "int key", "t": (1, 2)}),
    result(status="failed", trajectories=[]),
], ids=["plain", "subclass-fields", "own-to_dict", "nan-logprobs", "nan-reward-and-metric", "big-int",
        "int-key-tuple", "failed"])
def test_a_ledger_line_has_the_content_json_would_write(case):
    line = ledger_line(case)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    expected = json.dumps(record_of(case), ensure_ascii=False, separators=(",", ":"))
    assert as_json(line) == as_json(expected)
    assert as_json(json.dumps(codec.loads(line), allow_nan=True)) == as_json(expected)


def test_values_json_cannot_write_still_fail_as_they_did():
    case = result(metadata={"when": Extra()})
    with pytest.raises(TypeError):
        json.dumps(record_of(case))
    with pytest.raises(TypeError):
        ledger_line(case)


def test_read_head_is_the_record_without_its_trajectories():
    line = ledger_line(result(metadata={"trajectories": [1]}))  # the key inside a nested value, before the real one
    full = codec.loads(line)
    full.pop("trajectories")
    assert read_head(line) == full
    assert read_head(b'{"episode_id": "x", "status": "ok"}\n') == {"episode_id": "x", "status": "ok"}
    assert read_head(b"{not json\n") is None


# -- a run directory built line by line --------------------------------------------------------------


def line_of(eid, index, status="ok", reward=1.0, turn=False, error="boom", extra_tokens=0):
    traj = training(TurnSample, turn_rewards=[reward]) if turn else training()
    traj.input_ids = traj.input_ids + [7] * extra_tokens
    traj.loss_mask = traj.loss_mask + [1] * extra_tokens
    traj.logprobs = traj.logprobs + [-0.1] * extra_tokens
    traj.versions = traj.versions + [0] * extra_tokens
    traj.episode_id = traj.group_id = eid
    res = result(eid, index, status, reward=reward, trajectories=[traj] if status == "ok" else [],
                 metrics={"maj@1": reward})
    if status != "ok":
        res.error = f"{error} in {eid}"
    return ledger_line(res)


LEDGERS = {
    "one ledger": {"episodes.jsonl": [line_of(f"e{i}", i, reward=i % 2) for i in (3, 0, 2, 1, 5, 4)]},
    "retries and resumes": {"episodes.jsonl": [
        line_of("a", 0, "failed"), line_of("b", 1), line_of("a", 0), line_of("c", 2, "failed", error="first"),
        line_of("b", 1, "failed"), line_of("c", 2, "failed", error="second"), line_of("d", 3, reward=0.25),
        line_of("d", 3, reward=0.75)]},
    "rank ledgers": {
        "episodes.rank-00000.jsonl": [line_of(f"r{i}", i) for i in range(0, 40, 2)] + [line_of("r1", 1, "failed")],
        "episodes.rank-00001.jsonl": [line_of(f"r{i}", i, reward=0.5) for i in range(1, 40, 2)]},
    "bad lines and a torn tail": {"episodes.jsonl": [
        line_of("x", 0), b"{not json at all}\n", line_of("y", 1, "failed"), b"\n", line_of("z", 2),
        line_of("y", 1)[:40] + b"\n", b'{"episode_id":7,"status":"ok","samples":[]}\n', b"\xff\xfe{}\n",
        line_of("w", 3)[:-30]]},
    "a line cut after its head, then whole": {"episodes.jsonl": [
        line_of("v", 0), line_of("u", 1)[:-60] + b"\n", line_of("w", 2, "failed"), line_of("u", 1)]},
    "a winner cut after its head": {"episodes.jsonl": [line_of("v", 0), line_of("u", 1)[:-60] + b"\n"]},
    "one index, several ids": {"episodes.jsonl": [line_of("m", 5), line_of("k", 5), line_of("a", 7),
                                                  line_of("l", 5, "failed")]},
    "extra columns": {"episodes.jsonl": [line_of(f"t{i}", i, turn=True, reward=i / 4) for i in range(5)]},
    "long sequences": {"episodes.jsonl": [line_of(f"s{i}", i, extra_tokens=3000) for i in range(600)]},
}


def write_ledgers(root: Path, files: dict[str, list[bytes]]) -> Path:
    root.mkdir(parents=True)
    for name, lines in files.items():
        (root / name).write_bytes(b"".join(lines))
    return root


def in_memory(directory: Path, paths: list[Path]) -> dict:
    """The derived files and totals as every record held in memory gives them."""
    records = latest_records(paths)
    totals = RunMetrics()
    for record in records.values():
        totals.add(result_of(record))
    write_derived(directory, records)
    return totals.summary()


def contents(directory: Path) -> dict:
    out = {name: [as_json(line) for line in (directory / name).read_text().splitlines()]
           for name in ("samples.jsonl", "failures.jsonl")}
    try:
        ds = datasets.load_from_disk(str(directory / "trajectories"))
        out["dataset"] = (ds.features.to_dict(), ds.to_list())
    except Exception as exc:  # no rows at all: a dataset with no data file
        out["dataset"] = type(exc).__name__
    return out


@pytest.fixture(params=["one process", "worker processes"])
def processes(request, monkeypatch):
    """Write the derived files in this process, or in parts on worker processes (whenever there are 2+ records)."""
    if request.param == "worker processes":
        import scaffold_core.run.finalize as finalize

        monkeypatch.setattr(finalize, "RECORDS_PER_PROCESS", 1)
        monkeypatch.setattr(finalize, "usable_cores", lambda: 3)
    return request.param


@pytest.mark.parametrize("name", list(LEDGERS))
def test_streaming_derived_files_and_metrics_equal_the_in_memory_ones(tmp_path, name, processes, caplog):
    streamed = write_ledgers(tmp_path / "streamed", LEDGERS[name])
    paths = sorted(streamed.glob("episodes*.jsonl"))
    held = tmp_path / "held"
    shutil.copytree(streamed, held)
    expected_metrics = in_memory(held, sorted(held.glob("episodes*.jsonl")))
    metrics = finalize_run_dir(streamed, {}, hooks=Hooks(None), ledgers=paths)
    assert "processes failed" not in caplog.text  # the worker processes did the work, no fallback
    assert contents(streamed) == contents(held)
    clock = {"wall_s", "tokens_per_s", "episodes_per_s", "output_dir"}
    assert {k: v for k, v in metrics.items() if k not in clock} == \
        {k: v for k, v in expected_metrics.items() if k not in clock}
    expected_order = [r["episode_id"] for r in sorted(latest_records(paths).values(),
                                                      key=lambda r: (r.get("index", 0), r["episode_id"]))]
    with LedgerIndex(paths) as index:
        assert index.exact
        if name == "a winner cut after its head":  # found out when read whole: finalize took the in-memory path
            with pytest.raises(LedgerChanged):
                list(index.records())
        else:
            assert [r["episode_id"] for r in index.records()] == expected_order
    assert completed_ids(paths) == {e for e, r in latest_records(paths).items() if r["status"] == "ok"}
    assert not list(streamed.glob(".*tmp*"))  # no temp file or folder left


def test_a_ledger_the_index_cannot_describe_takes_the_in_memory_path(tmp_path):
    odd = b'{"episode_id":"b","index":1.5,"status":"ok","samples":[],"prompt":"","answer":null}\n'
    root = write_ledgers(tmp_path / "run", {"episodes.jsonl": [line_of("a", 0), odd]})
    with LedgerIndex([root / "episodes.jsonl"]) as index:
        assert not index.exact
    metrics = finalize_run_dir(root, {}, hooks=Hooks(None))
    assert metrics["episodes"] == 2 and metrics["completed"] == 2


def test_the_trajectories_dataset_has_the_rows_and_types_from_dict_gives(tmp_path):
    rows = [
        row(),
        row(reward=1, prompt_len=2.9, logprobs=[0, -1, -2], group_id=5),  # values that encoding converts
        row(input_ids=["4", "5", "6"]),
    ]
    records = {f"e{i}": {"episode_id": f"e{i}", "index": i, "status": "ok", "samples": [], "prompt": "",
                         "answer": None, "trajectories": [row]} for i, row in enumerate(rows)}
    write_derived(tmp_path, records)
    ours = datasets.load_from_disk(str(tmp_path / "trajectories"))
    from scaffold_core.output.derived import trajectory_features

    features = trajectory_features()
    theirs = datasets.Dataset.from_dict({name: [row.get(name) for row in rows] for name in features},
                                        features=features)
    assert ours.features == theirs.features and ours.to_list() == theirs.to_list()
    state = json.loads((tmp_path / "trajectories" / "state.json").read_text())
    assert state["_data_files"] == [{"filename": "data-00000-of-00001.arrow"}]


@pytest.mark.parametrize("status", ["none", "failed"])
def test_a_run_without_training_rows_still_writes_a_loadable_dataset(tmp_path, status):
    """No episodes, or only failed ones: trajectories/ loads as an empty dataset with the standard columns."""
    ledger = tmp_path / "episodes.jsonl"
    if status == "failed":
        failed = EpisodeResult(episode_id="e0", index=0, status="failed", error="engine down",
                               error_component="engine")
        ledger.write_bytes(ledger_line(failed))
    else:
        ledger.write_bytes(b"")
    metrics = finalize_run_dir(tmp_path, {}, hooks=Hooks(None), ledgers=[ledger])
    loaded = datasets.load_from_disk(str(tmp_path / "trajectories"))
    assert len(loaded) == 0 and {"input_ids", "loss_mask", "logprobs", "versions"} <= set(loaded.column_names)
    assert metrics["episodes"] == (1 if status == "failed" else 0)


def test_unicode_line_breaks_in_text_never_split_a_jsonl_line(tmp_path):
    """NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR in a response are escaped: line readers see one line each."""
    text = "a\u2028b\x85c\u2029d"
    sample = Sample([1], [2], [-0.5], [1], text, "stop", 0, 0, Verdict(1.0, text, text, "match"))
    result = EpisodeResult(episode_id="e0", index=0, status="ok", reference=text, samples=[sample])
    line = ledger_line(result).decode("utf-8")
    assert line.splitlines() == [line.rstrip("\n")]
    assert json.loads(line)["samples"][0]["response"] == text
    ledger = tmp_path / "episodes.jsonl"
    ledger.write_text(line, encoding="utf-8")
    finalize_run_dir(tmp_path, {}, hooks=Hooks(None), ledgers=[ledger], save_dataset=False)
    samples = (tmp_path / "samples.jsonl").read_text(encoding="utf-8")
    assert len(samples.splitlines()) == 1 and json.loads(samples)["response"] == text
