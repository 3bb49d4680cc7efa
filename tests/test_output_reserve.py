"""Blocks reserved ahead of a growing file: the file reads exactly as written, and nothing is kept past it."""

from __future__ import annotations

import os
import sys

import pytest

from scaffold_core.output import reserve
from scaffold_core.output.reserve import STEP, Reservation


def test_appends_into_reserved_blocks_read_back_exactly_and_the_rest_is_given_back(tmp_path):
    path = tmp_path / "shard.arrow"
    data = os.urandom(3 << 20)
    with open(path, "wb") as fh:
        grow = Reservation(path)
        for start in range(0, len(data), 1 << 20):
            grow.ensure(start + (1 << 20))
            fh.write(data[start:start + (1 << 20)])
            fh.flush()
            assert os.path.getsize(path) == start + (1 << 20)  # reserving never changes the file's size
        grow.close()
    assert path.read_bytes() == data
    assert os.stat(path).st_blocks * 512 < len(data) + STEP // 2  # what was reserved past the end is given back
    grow.close()  # closing twice is harmless


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fallocate is Linux's")
def test_an_append_descriptor_still_appends_at_the_end(tmp_path):
    path = tmp_path / "ledger"
    path.write_bytes(b"first\n")
    grow = Reservation(path)
    grow.ensure(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"second\n")
    os.close(fd)
    grow.close()
    assert path.read_bytes() == b"first\nsecond\n"


def test_without_fallocate_nothing_is_reserved_and_writing_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(reserve, "_FALLOCATE", False)
    path = tmp_path / "f"
    path.write_bytes(b"x")
    grow = Reservation(path)
    grow.ensure(10 << 20)
    grow.close()
    assert path.read_bytes() == b"x"


def test_a_refused_reservation_stops_reserving(tmp_path, monkeypatch):
    calls = []

    def refuse(fd, mode, offset, length):
        calls.append((offset, length))
        return -1

    monkeypatch.setattr(reserve, "_FALLOCATE", refuse)
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    grow = Reservation(path)
    grow.ensure(1 << 20)
    grow.ensure(2 << 20)
    grow.close()
    assert len(calls) == 1 and path.read_bytes() == b"abc"


def test_a_run_gives_back_what_it_reserved_ahead_of_its_ledger(dice_plugins, dice_config, tmp_path):
    from scaffold_core.output.ledger import read_ledger
    from scaffold_core.run.rollout import Rollout

    config = dice_config(task={"name": "sums", "count": 20})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    for name in ("episodes.jsonl", "episodes.tokens.bin"):
        info = os.stat(tmp_path / "run" / name)
        assert info.st_blocks * 512 < info.st_size + (1 << 20), name  # not the 64 MB reserved while it ran
    assert len(list(read_ledger(tmp_path / "run" / "episodes.jsonl"))) == 20
