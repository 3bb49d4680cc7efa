"""The run's store (SQLite): token arrays read back exactly as the trajectory maker made them and smaller than
JSON lists, a completed episode beats a failed one, a killed writer keeps whole steps and a sound database, and
the schema is brought up to date by its ordered migrations."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.errors import RunDirError
from scaffold_core.output import codec, migrations, read_records
from scaffold_core.output.rundir import RunOutput
from scaffold_core.output.store import EpisodeStore, StoreReader, decode, entry, record_of
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


def result(eid="e", index=0, trajectories=None, status="ok", answer="so 42"):
    sample = Sample([1], [2, 3], [-0.5, -0.25], [1, 1], answer, "stop", 0, 0, Verdict(1.0, "42", "42", "match"))
    return EpisodeResult(eid, index, status, reference="42", prompt_text="Q?",
                         samples=[sample] if status == "ok" else [], error=None if status == "ok" else "engine raised",
                         error_component=None if status == "ok" else "engine",
                         trajectories=[training()] if trajectories is None else trajectories)


def stored(tmp_path: Path, *results: EpisodeResult) -> list[dict]:
    """The records of ``results`` written to a store and read back."""
    store = EpisodeStore(tmp_path / "episodes.db")
    try:
        store.put(results)
    finally:
        store.close()
    return list(read_records(tmp_path))


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
    "versions beyond 32 bits": [training(versions=[-1, -1, -1, 2 ** 40, 2 ** 40, 7, 2 ** 40])],
    "extra fields": [training(TurnSample, turn_rewards=[0.5, 1.0])],
    "own to_dict": [training(RenamedSample)],
    "values that do not pack": [training(input_ids=["4", "5", "6", 7, 8, 9, 10]), training(input_ids=[2 ** 70] * 7),
                                training(logprobs=[0.0, 0.0, 0.0, "x", 1, 2, 3]),
                                training(loss_mask=[0, 0, 0, 1, 1, None, 1])],
}


@pytest.mark.parametrize("name", list(CASES))
def test_token_arrays_read_back_as_the_maker_made_them(tmp_path, name):
    res = result(trajectories=CASES[name])
    (back,) = stored(tmp_path, res)
    expected = json.loads(json.dumps(record_of(res)), parse_constant=float)
    got = json.loads(json.dumps(back), parse_constant=float)
    if name == "booleans in the mask":  # integer columns keep integers: a boolean comes back as 0 or 1
        assert got == expected and got["trajectories"][0]["loss_mask"] == [0, 0, 0, 1, 1, 1, 1]
    else:
        assert repr(got) == repr(expected)  # repr: NaN, the sign of zeros and int/float are compared too


def test_runs_keep_the_exact_value_and_sign(tmp_path):
    (back,) = stored(tmp_path, result(trajectories=[training(logprobs=[0.0, 0.0, -0.0, -0.25, -0.25, -0.25,
                                                                         -0.25])]))
    got = back["trajectories"][0]["logprobs"]
    assert [struct.pack("<d", v) for v in got[:3]] == [struct.pack("<d", v) for v in (0.0, 0.0, -0.0)]


def test_token_arrays_take_a_fraction_of_json_lists():
    long = training(prompt=500, generated=500, input_ids=[(i * 7919) % 50_000 for i in range(1000)],
                    logprobs=[0.0] * 500 + [float(np.float32(-i / 1000)) for i in range(500)])
    res = result(trajectories=[long])
    _, _, _, head, rows, blob = entry(res)
    assert len(head) + len(rows) + len(blob) < 0.25 * len(codec.dumps_compact(record_of(res)))
    assert len(blob) == 1000 * 2 + 500 * 4  # ids as <u2, generated logprobs as <f4; masks, versions: runs


def test_the_documented_sql_and_numpy_reading_gives_the_columns(tmp_path):
    stored(tmp_path, result(trajectories=[training(input_ids=[70_000, 5, 6, 7, 8, 9, 10])]))
    with contextlib.closing(sqlite3.connect(tmp_path / "episodes.db")) as db:
        (answer,) = db.execute("SELECT json_extract(head, '$.samples[0].response') FROM episodes").fetchone()
        rows, blob = db.execute("SELECT rows, tokens FROM episodes").fetchone()
    assert answer == "so 42"
    ((fields, columns),) = json.loads(rows)
    (seg,) = columns["input_ids"]
    ids = np.frombuffer(blob, dtype=seg[0], count=seg[2], offset=seg[1])
    assert ids.tolist() == [70_000, 5, 6, 7, 8, 9, 10]
    assert columns["loss_mask"] == [["run", 0, 3], ["run", 1, 4]] and fields["reward"] == 1.0


# -- a record's content ----------------------------------------------------------------------------------------
def metadata_result(metadata=None, reward=1.0, metrics=None):
    """An episode whose sample carries ``metadata`` (its verdict ``reward``) and whose record ``metrics``."""
    res = result()
    res.samples[0].metadata = metadata or {}
    res.samples[0].verdict = Verdict(reward, "42", "42", "match")
    res.metrics = metrics or {}
    return res


def as_json(text: bytes | str):
    """Parsed with the standard library, NaN kept comparable (NaN != NaN)."""
    return json.loads(text, parse_constant=lambda name: f"<{name}>")


@dataclass
class Extra:
    x: int = 1


@pytest.mark.parametrize("case", [
    result(),
    result(trajectories=[training(TurnSample, turn_rewards=[0.5, 1.0])]),
    result(trajectories=[training(RenamedSample)]),
    result(trajectories=[training(logprobs=[0.0, float("nan"), -math.inf])]),
    metadata_result(reward=float("inf"), metrics={"maj@4": float("nan")}),
    metadata_result({"big": 2 ** 70, "nested": {"k": [1, None, 2.5]}}),
    metadata_result({3: "int key", "t": (1, 2)}),
    result(status="failed", trajectories=[]),
], ids=["plain", "subclass-fields", "own-to_dict", "nan-logprobs", "nan-reward-and-metric", "big-int",
        "int-key-tuple", "failed"])
def test_a_stored_record_has_the_content_json_would_write(case):
    _, _, _, head, rows, blob = entry(case)
    assert b"\n" not in head and "\u2028".encode() not in head  # one line to any line reader
    expected = json.dumps(record_of(case), ensure_ascii=False, separators=(",", ":"))
    assert as_json(json.dumps(decode(head, rows, blob), allow_nan=True)) == as_json(expected)


def test_values_json_cannot_write_still_fail_as_they_did():
    case = metadata_result({"when": Extra()})
    with pytest.raises(TypeError):
        json.dumps(record_of(case))
    with pytest.raises(TypeError):
        entry(case)


# -- a completed episode beats a failed one ------------------------------------------------------------------
def test_a_completed_episode_beats_a_failed_one_whatever_comes_after(tmp_path):
    store = EpisodeStore(tmp_path / "episodes.db")
    try:
        for status, answer in [("failed", ""), ("ok", "first"), ("failed", ""), ("ok", "second"), ("failed", "")]:
            store.put([result("e", 0, status=status, answer=answer)])
        store.put([result("f", 1, status="failed"), result("f", 1, status="failed", trajectories=[])])
    finally:
        store.close()
    records = {r["episode_id"]: r for r in read_records(tmp_path)}
    assert records["e"]["status"] == "ok" and records["e"]["samples"][0]["response"] == "second"  # the latest ok
    assert records["f"]["status"] == "failed" and records["f"]["trajectories"] == []  # the latest failed one
    assert len(records) == 2


def test_stores_of_several_workers_merge_by_the_same_rule(tmp_path):
    from scaffold_core.output import merge_stores

    for rank, statuses in enumerate([("ok", "failed", "failed"), ("failed", "ok", "failed")]):
        store = EpisodeStore(tmp_path / f"episodes.rank-{rank:05d}.db")
        try:
            store.put(result(f"e{i}", i, status=s, answer=f"rank {rank}") for i, s in enumerate(statuses))
        finally:
            store.close()
    before = {r["episode_id"]: r["status"] for r in read_records(tmp_path)}  # read across the stores
    merge_stores(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes.db"]
    after = {r["episode_id"]: (r["status"], r["samples"][0]["response"] if r["samples"] else None)
             for r in read_records(tmp_path)}
    assert after == {"e0": ("ok", "rank 0"), "e1": ("ok", "rank 1"), "e2": ("failed", None)}
    assert before == {k: v[0] for k, v in after.items()}


# -- a killed writer keeps whole steps -------------------------------------------------------------------------
WRITER = """
import sys
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output.rundir import RunOutput
from scaffold_core.trajectory import TrainingSample

step, size = int(sys.argv[2]), int(sys.argv[3])
out = RunOutput(sys.argv[1], resume=True, prepared=True)
out.deferred = True
out.open()  # the schema exists before the first kill (a reader of a store not yet created would create it)
print("ready", flush=True)
while True:
    for j in range(size):
        n = 300 + 37 * j
        t = TrainingSample(list(range(n)), [0] * 100 + [1] * (n - 100), [0.0] * 100 + [-0.5] * (n - 100),
                           [-1] * 100 + [step] * (n - 100), 1.0, 0.0, f"s{step}-{j}", 0, f"s{step}", 100, "stop")
        out.append(EpisodeResult(f"s{step}-{j}", step * size + j, "ok", prompt_text="p" * 2000, trajectories=[t],
                                 samples=[Sample([1], [2], [-0.5], [1], "x" * 500, "stop", 0, step)]))
    out.flush()  # one step of the event loop: one transaction
    step += 1
"""


def test_a_writer_killed_again_and_again_keeps_whole_steps_and_a_sound_database(tmp_path):
    path = tmp_path / "episodes.db"
    size, step, kills = 7, 0, 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                       os.environ.get("PYTHONPATH")])))
    for delay in (0.05, 0.3, 0.15, 0.6, 0.4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(step), str(size)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"ready\n", proc.stderr.read()
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        kills += 1
        with contextlib.closing(sqlite3.connect(path)) as db:  # a reader sees what the killed writer left
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            ids = [eid for (eid,) in db.execute("SELECT episode_id FROM episodes")]
        steps: dict[str, set[str]] = {}
        for eid in ids:
            steps.setdefault(eid.split("-")[0], set()).add(eid)
        assert all(len(members) == size for members in steps.values()), "a step was kept in part"
        step = 1 + max((int(s[1:]) for s in steps), default=step - 1)
    assert kills == 5 and step > 5  # steps were written between the kills
    records = list(read_records(tmp_path))
    assert all(len(r["trajectories"][0]["input_ids"]) == 300 + 37 * int(r["episode_id"].split("-")[1])
               for r in records)


# -- the schema ----------------------------------------------------------------------------------------------
def test_migrations_run_once_in_order_and_a_newer_store_is_refused(tmp_path, monkeypatch):
    stored(tmp_path, result())
    db_path = tmp_path / "episodes.db"
    applied: list[str] = []

    def m900_add_a_column(db):
        applied.append("m900")
        db.execute("ALTER TABLE episodes ADD COLUMN note TEXT")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, m900_add_a_column])
    for _ in range(2):  # an older store is brought up to date when it is opened, once
        with StoreReader(db_path) as reader:
            assert reader.count() == 1
    assert applied == ["m900"]
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        names = [name for (name,) in db.execute("SELECT name FROM _scaffold_migrations ORDER BY applied_at")]
    assert names == [*(fn.__name__ for fn in migrations.MIGRATIONS)]
    monkeypatch.undo()  # this version does not know m900: the store was written by a newer one
    with pytest.raises(RunDirError, match="written by a newer scaffold .*m900_add_a_column.*upgrade"):
        StoreReader(db_path)


def test_a_store_that_is_not_a_database_is_a_one_line_error_naming_it(tmp_path):
    (tmp_path / "episodes.db").write_bytes(b"not a database, " * 100)
    out = RunOutput(tmp_path, resume=True, prepared=True)
    with pytest.raises(RunDirError) as caught:
        out.completed_ids()
    message = str(caught.value)
    assert str(tmp_path / "episodes.db") in message and "--resume" in message and "\n" not in message
