"""The engine's thread count follows the machine's load (``core_share.py``), and the lean forward gives the same
bits on any thread count (so a seeded run samples the same tokens and logprobs whatever the load)."""

from __future__ import annotations

import os
import threading
import time
import types

import pytest

from scaffold_transformers import core_share
from scaffold_transformers.core_share import INTERVAL_S, PROBE_EVERY, RETRY_S, STALE_S, CoreShare


class FakeTorch:
    def __init__(self) -> None:
        self.set: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.set.append(n)


class Machine:
    """A clock and the CPU seconds others have used, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.others = 0.0

    def spend(self, seconds: float, others_cores: float) -> None:
        self.now += seconds
        self.others += seconds * others_cores


def share(cores: int = 2) -> tuple[CoreShare, FakeTorch, Machine]:
    torch, machine = FakeTorch(), Machine()
    cores_share = CoreShare(torch, cores, clock=lambda: machine.now, others_s=lambda: machine.others)
    return cores_share, torch, machine


def test_an_idle_machine_gets_every_core_after_the_load_and_a_busy_one_a_core_fewer_at_once():
    s, torch, m = share()
    s.start()
    assert torch.set == [1]  # one core fewer until it has looked
    m.spend(2.0, 0.0)  # the model's load: nothing else ran
    assert s.adjust() == 2 and torch.set == [1, 2]
    m.spend(INTERVAL_S, 0.0)
    assert s.adjust() == 2
    m.spend(INTERVAL_S, 0.6)  # a neighbour starts
    assert s.adjust() == 1
    m.spend(INTERVAL_S, 0.05)  # it stops: one calm look is not enough to take the core back
    assert s.adjust() == 1
    m.spend(INTERVAL_S, 0.05)
    assert s.adjust() == 2
    assert s.changes == 3 and torch.set == [1, 2, 1, 2]


def test_a_busy_load_keeps_a_core_free_and_looks_between_intervals_change_nothing():
    s, torch, m = share()
    s.start()
    m.spend(2.0, 1.0)
    assert s.adjust() == 1
    m.spend(INTERVAL_S / 3, 0.0)
    assert s.adjust() == 1  # too soon to look again
    m.spend(INTERVAL_S, 0.15)  # between the thresholds: stays
    assert s.adjust() == 1
    assert torch.set == [1]


def test_what_others_did_while_the_engine_rested_does_not_count():
    s, torch, m = share()
    s.start()
    m.spend(1.0, 0.0)
    assert s.adjust() == 2
    s.rest()
    m.spend(0.4, 1.0)  # busy while the engine waits for requests (a client's own work between them)
    assert s.adjust() == 2  # the new look starts now
    m.spend(INTERVAL_S, 0.0)
    assert s.adjust() == 2
    m.spend(STALE_S * 2, 1.0)  # a look too old to judge by starts afresh too
    assert s.adjust() == 2
    m.spend(INTERVAL_S, 1.0)
    assert s.adjust() == 1


def decode(s: CoreShare, m: Machine, steps: int, seconds: dict[int, float]) -> list[int]:
    """``steps`` decode steps of 3 rows on an idle machine, each taking ``seconds[threads]``: the thread counts."""
    used = []
    for _ in range(steps):
        threads = s.step_threads()
        used.append(threads)
        m.spend(seconds[threads], 0.0)
        s.timed(3, seconds[threads])
    return used


def test_every_core_stays_where_it_is_faster_and_one_step_in_so_many_checks_it():
    s, torch, m = share()
    s.start()
    m.spend(1.0, 0.0)
    used = decode(s, m, 4 * PROBE_EVERY, {2: 0.010, 1: 0.013})
    assert used.count(1) == 4 and used[PROBE_EVERY - 1] == 1  # the probes, one in PROBE_EVERY
    assert s.threads == 2 and used[-2] == 2


def test_where_every_core_is_slower_the_engine_keeps_a_core_fewer_for_a_while():
    s, torch, m = share()
    s.start()
    m.spend(1.0, 0.0)
    # libgomp's sleeping threads (other OpenMP teams in the process): two threads slower than one
    used = decode(s, m, 2 * PROBE_EVERY, {2: 0.014, 1: 0.010})
    assert used[-1] == 1 and s.threads == 1  # two probes found one thread as fast
    assert set(decode(s, m, 100, {2: 0.014, 1: 0.010})) == {1}  # calm looks do not bring every core back ...
    m.spend(RETRY_S, 0.0)
    assert decode(s, m, 60, {2: 0.014, 1: 0.010}).count(2) > 20  # ... until it is tried again


def test_transformers_forward_keeps_the_least_threads_and_one_core_has_nothing_to_share():
    s, torch, m = share()
    s.start()
    m.spend(1.0, 0.0)
    assert s.adjust() == 2
    assert s.adjust(lean=False) == 1
    single, torch1, m1 = share(cores=1)
    single.start()
    m1.spend(1.0, 0.0)
    assert single.adjust() == 1 and single.changes == 0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc")
def test_a_busy_thread_of_this_process_counts_as_others_and_the_caller_does_not(monkeypatch):
    # no other process (the tests beside this one may be busy): the machine's busy time is this process's
    monkeypatch.setattr(core_share, "_machine_busy_s", lambda: sum(os.times()[:2]))
    s = CoreShare(FakeTorch(), 2)
    stop = threading.Event()
    spun: list[float] = []

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))
        spun.append(time.thread_time())  # the spinner's own CPU seconds

    before = s._measure_others_s()
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    began = time.monotonic()
    while time.monotonic() - began < 0.5:  # the caller is busy too (it must not count)
        sum(range(1000))
    used = s._measure_others_s() - before
    stop.set()
    spinner.join(5)
    assert s._measure_others_s() - before == pytest.approx(used, abs=0.05)  # an ended thread takes nothing back
    # what the spinner used, and not what the caller used beside it (sharing Python's lock, each about half)
    assert spun and used == pytest.approx(spun[0], abs=0.04)
    assert used >= 0.05


def test_a_thread_listed_after_it_ended_takes_nothing_back(monkeypatch):
    # threading.enumerate may still list a thread whose /proc entry is gone, and an ended thread's id may be
    # reused by a new one: neither may make what others used go down
    monkeypatch.setattr(core_share, "_machine_busy_s", lambda: sum(os.times()[:2]))
    listed = [types.SimpleNamespace(native_id=1001), types.SimpleNamespace(native_id=1002)]
    used: dict[int, float | None] = {1001: 0.3, 1002: 0.2}
    monkeypatch.setattr(core_share.threading, "enumerate", lambda: listed)
    monkeypatch.setattr(core_share, "_thread_s", lambda tid: used[tid])
    s = CoreShare(FakeTorch(), 2)
    first = s._measure_others_s()
    used[1001] = None  # ended, still listed
    used[1002] = 0.25
    second = s._measure_others_s()
    assert second - first == pytest.approx(0.05, abs=0.02)
    used[1001] = 0.01  # the id reused by a new thread
    assert s._measure_others_s() - second == pytest.approx(0.01, abs=0.02)


def test_without_proc_the_engine_keeps_a_core_free(monkeypatch):
    monkeypatch.setattr(core_share.os.path, "exists", lambda path: False)
    torch = FakeTorch()
    s = CoreShare(torch, 2)
    s.start()
    assert s.adjust() == 1 and torch.set == [1]


def test_attention_with_few_queries_gives_the_same_bits_on_any_thread_count():
    torch = pytest.importorskip("torch")
    from scaffold_transformers.lean_llama import attention

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for rows, queries, keys in ((1, 1, 700), (3, 1, 300), (1, 3, 400)):
            q = torch.randn(rows, 9, queries, 64)
            k, v = torch.randn(rows, 3, keys, 64), torch.randn(rows, 3, keys, 64)
            mask = torch.ones(rows, 1, queries, keys, dtype=torch.bool)
            mask[0, ..., : keys // 3] = False  # the first row's left padding
            out = []
            for n in (1, 2):
                torch.set_num_threads(n)
                out.append(attention(torch, q, k, v, mask))
            assert torch.equal(out[0], out[1])
            fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            assert torch.allclose(out[0], fused, atol=1e-6)
    finally:
        torch.set_num_threads(threads)


def test_a_seeded_run_samples_the_same_bits_on_one_thread_and_on_two():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import asyncio

    from scaffold_core.generation import GenerationRequest
    from scaffold_core.sampling import SamplingParams
    from scaffold_core.tokenizers import ByteTokenizer
    from scaffold_transformers.packed_weights import half_unsupported
    from scaffold_transformers.transformers_engine import TransformersEngine

    if half_unsupported(torch, 1.0) is not None:
        pytest.skip("this torch build has no float16 products")

    class NoEos(ByteTokenizer):
        eos_token_id = None

    torch.manual_seed(0)  # head_dim 64 and a long prompt: where torch's fused attention would split the keys
    config = transformers.LlamaConfig(vocab_size=ByteTokenizer().vocab_size, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=1024, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts = [[(7 * i + j) % 200 + 3 for j in range(300 + 40 * i)] for i in range(3)]
    threads = torch.get_num_threads()

    async def run(n: int) -> list:
        async with TransformersEngine.wrap(model, NoEos(), pack_weights=True, float16_weights=True,
                                           threads=n) as engine:
            requests = [GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=8, temperature=1.0), seed=i)
                        for i, p in enumerate(prompts)]
            single = await engine.generate(GenerationRequest("one", prompts[1], SamplingParams(max_tokens=8),
                                                             seed=9))
            return [(r.output_ids, r.logprobs) for r in await asyncio.gather(*map(engine.generate, requests))] + [
                (single.output_ids, single.logprobs)]

    try:
        assert asyncio.run(run(1)) == asyncio.run(run(2))
    finally:
        torch.set_num_threads(threads)
