"""The ledger's token arrays, packed in binary in its sidecar: read back exactly as the trajectory maker made
them, smaller than JSON lists, and a blob that is missing or damaged makes its line not a record."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output import codec, read_ledger
from scaffold_core.output.ledger import completed_ids, ledger_line, packed_entry, record_of, with_token_lists
from scaffold_core.output.ledger_index import LedgerChanged, LedgerIndex
from scaffold_core.output.rundir import RunOutput
from scaffold_core.output.tokens import tokens_name
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.run.finalize import finalize_run_dir
from scaffold_core.trajectory import TrainingSample
from scaffold_core.verifier import Verdict


@dataclass(slots=True)
class TurnSample(TrainingSample):
    turn_rewards: list[float] = field(default_factory=list)


@dataclass(slots=True)
class RenamedSample(TrainingSample):
    def to_dict(self):
        return {"ids": self.input_ids, "reward": self.reward}


def training(cls=TrainingSample, prompt=3, generated=4, **changes):
    n = prompt + generated
    fields = dict(input_ids=list(range(100, 100 + n)), loss_mask=[0] * prompt + [1] * generated,
                  logprobs=[0.0] * prompt + [-0.25] * generated, versions=[-1] * prompt + [0] * generated,
                  reward=1.0, advantage=0.5, episode_id="e", sample_index=0, group_id="e", prompt_len=prompt,
                  finish_reason="stop")
    return cls(**{**fields, **changes})


def result(eid="e", index=0, trajectories=None, status="ok"):
    sample = Sample([1], [2, 3], [-0.5, -0.25], [1, 1], "so 42", "stop", 0, 0, Verdict(1.0, "42", "42", "match"))
    return EpisodeResult(eid, index, status, reference="42", prompt_text="Q?",
                         samples=[sample] if status == "ok" else [], error=None if status == "ok" else "engine raised",
                         error_component=None if status == "ok" else "engine",
                         trajectories=[training()] if trajectories is None else trajectories)


def read_back(res: EpisodeResult) -> tuple[dict, bytes, bytes]:
    line, blob, record = packed_entry(res, 0)
    assert codec.loads(line) == json.loads(json.dumps(record))  # the line is the record
    return with_token_lists(codec.loads(line), blob), line, blob


CASES = {
    "plain": [training()],
    "large vocabulary": [training(input_ids=[70_000, 5, 2 ** 31 + 1, 3, 4, 1, 0])],
    "several sequences": [training(), training(sample_index=1, generated=9, logprobs=[0.0] * 3 + [-0.1] * 9)],
    "multi-turn mask and versions": [training(loss_mask=[0, 0, 0, 1, 0, 1, 1], versions=[-1, -1, -1, 3, -1, 4, 4],
                                              logprobs=[0.0, 0.0, 0.0, -0.5, 0.0, -0.7, -0.1])],
    "logprobs float32 cannot hold": [training(logprobs=[0.0] * 3 + [-0.1234567, -1e-300, -2.5, -0.1])],
    "signed zeros": [training(logprobs=[0.0, -0.0, 0.0, -0.0, -0.0, -0.0, -0.0])],
    "NaN and infinity": [training(logprobs=[0.0] * 3 + [float("nan"), -math.inf, math.inf, -0.5])],
    "one NaN, repeated": [training(logprobs=[float("nan")] * 7)],
    "infinity after the prompt": [training(logprobs=[0.0] * 3 + [-math.inf] * 4)],
    "NaN in the other fields": [training(advantage=float("nan"), reward=-math.inf)],
    "NaN in an extra field": [training(TurnSample, turn_rewards=[float("nan"), 1.0])],
    "prompt_len out of range": [training(prompt_len=50), training(prompt_len=-1), training(prompt_len=2.5)],
    "empty sequence": [training(input_ids=[], loss_mask=[], logprobs=[], versions=[], prompt=0, generated=0)],
    "booleans in the mask": [training(loss_mask=[False, False, False, True, True, True, True])],
    "extra fields": [training(TurnSample, turn_rewards=[0.5, 1.0])],
    "own to_dict": [training(RenamedSample)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_token_arrays_read_back_as_the_maker_made_them(name):
    res = result(trajectories=CASES[name])
    back, line, _ = read_back(res)
    expected = json.loads(json.dumps(record_of(res)), parse_constant=float)
    got = json.loads(json.dumps(back), parse_constant=float)
    if name == "booleans in the mask":  # integer columns keep integers: a boolean comes back as 0 or 1
        assert got == expected and got["trajectories"][0]["loss_mask"] == [0, 0, 0, 1, 1, 1, 1]
    else:
        assert repr(got) == repr(expected)  # repr: NaN, the sign of zeros and int/float are compared too
    assert (b'"tokens":' in line) == (name != "own to_dict")


@pytest.mark.parametrize("values", [
    {"input_ids": ["4", "5", "6", 7, 8, 9, 10]}, {"input_ids": [2 ** 70] * 7},
    {"logprobs": [0.0, 0.0, 0.0, "x", 1, 2, 3]}, {"loss_mask": [0, 0, 0, 1, 1, None, 1]}])
def test_values_that_do_not_pack_keep_the_json_lists(tmp_path, values):
    res = result(trajectories=[training(**values)])
    line, blob, record = packed_entry(res, 0)
    assert blob == b"" and line == ledger_line(res) and record == record_of(res)
    (tmp_path / "episodes.jsonl").write_bytes(line)
    (tmp_path / tokens_name("episodes.jsonl")).write_bytes(b"")
    assert list(read_ledger(tmp_path / "episodes.jsonl")) == [json.loads(ledger_line(res))]


def test_packed_token_arrays_are_a_fraction_of_json_lists():
    long = training(prompt=500, generated=500, input_ids=[(i * 7919) % 50_000 for i in range(1000)],
                    logprobs=[0.0] * 500 + [float(np.float32(-i / 1000)) for i in range(500)])
    res = result(trajectories=[long])
    line, blob, _ = packed_entry(res, 0)
    assert len(line) + len(blob) < 0.25 * len(ledger_line(res))
    assert len(blob) == 1000 * 2 + 500 * 4  # ids as <u2, generated logprobs as <f4, the rest fills


def test_the_documented_numpy_reading_gives_the_columns():
    res = result(trajectories=[training(input_ids=[70_000, 5, 6, 7, 8, 9, 10])])
    line, blob, _ = packed_entry(res, 0)
    (row,) = json.loads(line)["trajectories"]
    (seg,) = row["input_ids"]
    ids = np.frombuffer(blob, dtype=seg["dtype"], count=seg["n"], offset=seg["at"])
    assert ids.tolist() == [70_000, 5, 6, 7, 8, 9, 10]
    assert row["loss_mask"] == [{"fill": 0, "n": 3}, {"fill": 1, "n": 4}]


def write_packed(root: Path, results: list[EpisodeResult]) -> Path:
    """A ledger and its sidecar as a run appends them."""
    root.mkdir(parents=True, exist_ok=True)
    lines, blobs = [], b""
    for res in results:
        line, blob, _ = packed_entry(res, len(blobs))
        lines.append(line)
        blobs += blob
    (root / "episodes.jsonl").write_bytes(b"".join(lines))
    (root / "episodes.tokens.bin").write_bytes(blobs)
    return root / "episodes.jsonl"


@pytest.mark.parametrize("damage", ["truncated", "a byte changed", "deleted", "garbage appended"])
def test_a_missing_or_damaged_blob_makes_its_line_not_a_record(tmp_path, damage):
    results = [result(f"e{i}", i, trajectories=[training(episode_id=f"e{i}")]) for i in range(4)]
    results.insert(2, result("f", 9, status="failed", trajectories=[]))
    ledger = write_packed(tmp_path, results)
    sidecar = tmp_path / "episodes.tokens.bin"
    data = sidecar.read_bytes()
    blob = len(data) // 4
    if damage == "truncated":
        sidecar.write_bytes(data[:3 * blob + 5])  # e3 is cut
    elif damage == "a byte changed":
        sidecar.write_bytes(data[:blob + 3] + bytes([data[blob + 3] ^ 1]) + data[blob + 4:])  # e1 is changed
    elif damage == "deleted":
        sidecar.unlink()
    else:
        sidecar.write_bytes(data + b"\xff" * 100)
    broken = {"truncated": {"e3"}, "a byte changed": {"e1"}, "deleted": {"e0", "e1", "e2", "e3"},
              "garbage appended": set()}[damage]
    bad: list[int] = []
    records = list(read_ledger(ledger, bad))
    assert {r["episode_id"] for r in records} == {"e0", "e1", "e2", "e3", "f"} - broken
    line_of = {"e0": 1, "e1": 2, "f": 3, "e2": 4, "e3": 5}
    assert sorted(bad) == sorted(line_of[e] for e in broken)
    assert completed_ids([ledger]) == {"e0", "e1", "e2", "e3"} - broken  # its episode runs again on resume
    with LedgerIndex([ledger]) as index:
        if broken:
            with pytest.raises(LedgerChanged):
                list(index.packed_records())
        else:
            assert [r["episode_id"] for r, _ in index.packed_records()] == ["e0", "e1", "e2", "e3", "f"]
    metrics = finalize_run_dir(tmp_path, {}, hooks=Hooks(None), ledgers=[ledger])
    assert metrics["completed"] == 4 - len(broken)
    samples = [json.loads(line)["episode_id"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples == [e for e in ("e0", "e1", "e2", "e3") if e not in broken]


def test_a_blob_reference_that_does_not_fit_its_line_is_not_a_record(tmp_path):
    ledger = write_packed(tmp_path, [result()])
    record = json.loads(ledger.read_bytes())
    record["trajectories"][0]["input_ids"][0]["at"] = 10_000  # lies outside the blob
    ledger.write_text(json.dumps(record) + "\n")
    bad: list[int] = []
    assert list(read_ledger(ledger, bad)) == [] and bad == [1]


def test_fills_keep_the_exact_value_and_sign():
    zeros = struct.pack("<d", 0.0), struct.pack("<d", -0.0)
    back, _, _ = read_back(result(trajectories=[training(logprobs=[0.0, 0.0, -0.0, -0.25, -0.25, -0.25, -0.25])]))
    got = back["trajectories"][0]["logprobs"]
    assert [struct.pack("<d", v) for v in got[:3]] == [zeros[0], zeros[0], zeros[1]]


@pytest.mark.parametrize("damage", ["emptied", "deleted"])
def test_blobs_written_on_resume_never_revive_a_line_whose_blob_was_lost(tmp_path, damage):
    # The episodes run again on resume and, being deterministic, pack to the same bytes: were they appended
    # where the lost blobs were, the old lines would check again and each episode would be in the ledger twice.
    results = [result(f"e{i}", i, trajectories=[training(episode_id=f"e{i}")]) for i in range(4)]
    ledger = write_packed(tmp_path, results)
    sidecar = tmp_path / "episodes.tokens.bin"
    if damage == "emptied":
        sidecar.write_bytes(b"")
    else:
        sidecar.unlink()
    out = RunOutput(tmp_path, resume=True)
    try:
        assert out.completed_ids() == set()
        for res in results:
            out.append(res)
        out.close()
    finally:
        out.release()
    assert sorted(r["episode_id"] for r in read_ledger(ledger)) == ["e0", "e1", "e2", "e3"]
    assert completed_ids([ledger]) == {"e0", "e1", "e2", "e3"}
