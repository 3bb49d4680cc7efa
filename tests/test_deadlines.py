"""Shared-timer waits (scaffold_core.run.deadlines) end exactly as asyncio.timeout's do."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from scaffold_core.run.deadlines import Deadlines

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 uses asyncio.wait_for directly")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_wait_past_its_deadline_raises_timeout_error_at_the_deadline():
    async def main():
        deadlines = Deadlines()
        start = time.perf_counter()
        with pytest.raises(TimeoutError):
            await deadlines.bounded(asyncio.sleep(10), 0.2)
        return time.perf_counter() - start

    assert 0.19 <= run(main()) < 2.0


def test_a_wait_that_finishes_in_time_returns_its_result_and_leaves_the_task_uncancelled():
    async def work():
        await asyncio.sleep(0.01)
        return 42

    async def main():
        deadlines = Deadlines()
        results = [await deadlines.bounded(work(), 5.0) for _ in range(3)]
        task = asyncio.current_task()
        await asyncio.sleep(0.05)  # a leftover cancel request would surface here
        return results, task.cancelling()

    assert run(main()) == ([42, 42, 42], 0)


def test_waits_of_one_length_expire_in_order_and_each_at_its_own_deadline():
    start = time.perf_counter()

    async def one(deadlines, delay, seconds, log):
        await asyncio.sleep(delay)
        try:
            await deadlines.bounded(asyncio.sleep(10), seconds)
        except TimeoutError:
            log.append((delay, time.perf_counter() - start))

    async def main():
        deadlines, log = Deadlines(), []
        await asyncio.gather(*(one(deadlines, d, 0.3, log) for d in (0.0, 0.2, 0.4)))
        return log

    log = run(main())
    assert [delay for delay, _ in log] == [0.0, 0.2, 0.4]
    for delay, ended in log:
        assert delay + 0.3 <= ended + 0.01 < delay + 0.3 + 1.0  # at its own deadline, not at an earlier or later one


def test_short_waits_between_long_ones_are_not_held_until_the_long_ones_end():
    async def main():
        deadlines = Deadlines()
        long_wait = asyncio.ensure_future(deadlines.bounded(asyncio.sleep(0.5), 5.0))
        await asyncio.sleep(0)
        for _ in range(5000):  # finished behind a wait still running: dropped, not kept until it ends
            await deadlines.bounded(asyncio.sleep(0), 5.0)
        queue = deadlines._queues[5.0]
        held = len(queue.waits)
        await long_wait
        return held

    assert run(main()) < 200


def test_an_outer_deadline_cancels_an_inner_wait_and_only_the_outer_reports_the_timeout():
    async def main():
        deadlines = Deadlines()
        inner_saw = []

        async def inner():
            try:
                await deadlines.bounded(asyncio.sleep(10), 5.0)
            except BaseException as exc:
                inner_saw.append(type(exc).__name__)
                raise

        with pytest.raises(TimeoutError):
            await deadlines.bounded(inner(), 0.1)
        return inner_saw

    assert run(main()) == ["CancelledError"]


def test_inner_and_outer_deadlines_expiring_together_behave_as_asyncio_timeout():
    async def nested(bounded):
        async def inner():
            return await bounded(asyncio.sleep(10), 0.1)

        try:
            await bounded(inner(), 0.1)
        except BaseException as exc:
            return type(exc).__name__
        return "finished"

    async def with_asyncio(awaitable, seconds):
        async with asyncio.timeout(seconds):
            return await awaitable

    async def main():
        return await nested(Deadlines().bounded), await nested(with_asyncio)

    ours, theirs = run(main())
    assert ours == theirs == "TimeoutError"


def test_a_cancel_from_outside_stays_a_cancel():
    async def main():
        deadlines = Deadlines()
        task = asyncio.ensure_future(deadlines.bounded(asyncio.sleep(10), 5.0))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return True

    assert run(main())


def test_none_means_no_deadline_and_a_new_loop_starts_afresh():
    deadlines = Deadlines()

    async def main():
        return await deadlines.bounded(asyncio.sleep(0.01, result="ok"), None)

    assert asyncio.run(main()) == "ok"

    async def timed():
        with pytest.raises(TimeoutError):
            await deadlines.bounded(asyncio.sleep(10), 0.05)
        return True

    assert asyncio.run(timed()) and asyncio.run(timed())  # the same object on two event loops
