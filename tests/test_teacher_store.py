"""A teacher's per-token logprobs in a training run's store and exports: beside the behaviour logprobs,
bit for bit, with the episode's teacher-student KL as a column of the store."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import struct

import numpy as np
import pytest
from scaffold_testkit import ListTask, ScriptedEngine

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.output import migrations, read_records
from scaffold_core.run.assembly import Components
from scaffold_core.sampling import SamplingParams
from scaffold_core.train.filtering import KEEP_EVERY_GROUP, run_step_groups
from scaffold_core.train.prompt_groups import TrainingRollouts
from scaffold_core.train.step_ledger import StepLedger

ROWS = [{"id": "a", "question": "a", "answer": "1"}, {"id": "b", "question": "b", "answer": "1"}]


def one_step():
    async def go():
        components = Components(task=ListTask(ROWS), controller=NativeController(),
                                engine=ScriptedEngine(lambda prompt, request: "one two three"),
                                verifier=ExactMatchVerifier())
        async with TrainingRollouts(components, sampling=SamplingParams(max_tokens=8, seed=1)) as r:
            return await run_step_groups(r, list(enumerate(r.rows())), samples=2, step=1,
                                         group_filter=KEEP_EVERY_GROUP)
    return asyncio.run(go())


def bits(values):
    return [struct.pack("<d", v) for v in values]


def teacher_rows(samples):
    """Per sample: logprobs float32 cannot hold (so <f8 in the store), a negative zero, and one float32 row."""
    rows = []
    for k, s in enumerate(samples):
        n = len(s.input_ids) - s.prompt_len
        if k == 0:
            rows.append([float(np.float32(-0.5 - j / 8)) for j in range(n)])  # float32 values: exact in the exports
        else:
            rows.append([-0.1234567891234 * (j + 1) - k for j in range(n - 1)] + [-0.0])
    return rows


def test_teacher_logprobs_round_trip_bit_for_bit_beside_the_behaviour_logprobs(tmp_path):
    import datasets
    import pyarrow.parquet as pq

    first = one_step()
    samples = [s for g in first.used for s in g.samples]
    given = teacher_rows(samples)
    ledger = StepLedger(tmp_path / "run")
    try:
        with pytest.raises(ValueError, match="1 teacher logprob rows for 4 samples"):
            ledger.write_step(first, weight_version=0, teacher_logprobs=given[:1])
        with pytest.raises(ValueError, match="teacher logprobs for .* completion tokens"):
            ledger.write_step(first, weight_version=0, teacher_logprobs=[row[:-1] for row in given])
        ledger.write_step(first, weight_version=0, teacher_logprobs=given)
        ledger.finish(save_parquet=True)
    finally:
        ledger.close()

    records = list(read_records(tmp_path / "run"))
    stored = {(t["episode_id"], t["sample_index"]): t for r in records for t in r["trajectories"]}
    kl_expected = {}
    for s, row in zip(samples, given):
        t = stored[(s.episode_id, s.sample_index)]
        n = s.prompt_len
        assert len(t["teacher_logprobs"]) == len(t["logprobs"]) == len(t["input_ids"])
        assert bits(t["teacher_logprobs"][:n]) == bits([0.0] * n)  # the prompt: nothing scored
        assert bits(t["teacher_logprobs"][n:]) == bits([v if m else 0.0 for v, m in zip(row, t["loss_mask"][n:])])
        gen = [(b, x) for b, x, m in zip(t["logprobs"], t["teacher_logprobs"], t["loss_mask"]) if m]
        kl_expected.setdefault(s.episode_id, []).extend(b - x for b, x in gen)
    with contextlib.closing(sqlite3.connect(tmp_path / "run" / "episodes.db")) as db:
        kl = dict(db.execute("SELECT episode_id, teacher_kl FROM episodes"))
    assert kl == pytest.approx({e: sum(v) / len(v) for e, v in kl_expected.items()}, rel=1e-12)

    # Exports: one list per sequence, float32 as the behaviour logprobs are (exact for float32 values).
    dataset = datasets.load_from_disk(str(tmp_path / "run" / "trajectories"))
    table = pq.read_table(tmp_path / "run" / "trajectories.parquet").to_pylist()
    for rows in (dataset.to_list(), table):
        by_key = {(r["episode_id"], r["sample_index"]): r for r in rows}
        for s in samples:
            got = by_key[(s.episode_id, s.sample_index)]["teacher_logprobs"]
            want = [float(np.float32(v)) for v in stored[(s.episode_id, s.sample_index)]["teacher_logprobs"]]
            assert bits(got) == bits(want)
    exact = by_key[(samples[0].episode_id, samples[0].sample_index)]["teacher_logprobs"]
    assert bits(exact) == bits(stored[(samples[0].episode_id, samples[0].sample_index)]["teacher_logprobs"])


def test_a_step_without_a_teacher_has_no_teacher_column_and_no_kl(tmp_path):
    import datasets

    ledger = StepLedger(tmp_path / "run")
    try:
        ledger.write_step(one_step(), weight_version=0)
        ledger.finish()
    finally:
        ledger.close()
    assert all(t["teacher_logprobs"] is None for r in read_records(tmp_path / "run") for t in r["trajectories"])
    assert "teacher_logprobs" not in datasets.load_from_disk(str(tmp_path / "run" / "trajectories")).column_names
    with contextlib.closing(sqlite3.connect(tmp_path / "run" / "episodes.db")) as db:
        assert {kl for (kl,) in db.execute("SELECT teacher_kl FROM episodes")} == {None}


def test_a_store_from_before_the_teacher_column_is_brought_up_to_date(tmp_path, monkeypatch):
    path = tmp_path / "run" / "episodes.db"
    path.parent.mkdir()
    monkeypatch.setattr(migrations, "MIGRATIONS", [migrations.m001_episodes])
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        migrations.migrate(db)
        assert "teacher_kl" not in {row[1] for row in db.execute("PRAGMA table_info(episodes)")}
    monkeypatch.undo()
    first = one_step()
    samples = [s for g in first.used for s in g.samples]
    ledger = StepLedger(tmp_path / "run", resume=True)
    try:
        ledger.write_step(first, weight_version=0, teacher_logprobs=teacher_rows(samples))
    finally:
        ledger.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM episodes WHERE teacher_kl IS NOT NULL").fetchone()[0] == len(samples)
