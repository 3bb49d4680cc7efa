"""A single-turn verifiers environment with a rubric: sums to compute, two weighted rewards (one async)
and a metric. Written against the verifiers.v1 public API, as an environment package is."""

from __future__ import annotations

import asyncio
import re

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithConfig(vf.TasksetConfig):
    n: int = 6
    """How many problems."""
    start: int = 1


def final_answer(text: str) -> str | None:
    found = re.findall(r"####\s*(-?\d+)", text)
    return found[-1] if found else None


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return 1.0 if final_answer(trace.last_reply) == task.answer else 0.0

    @vf.reward(weight=0.25)
    async def formatted(self, trace: vf.Trace) -> float:
        await asyncio.sleep(0.001)  # reward functions are coroutines, awaited together by the scoring
        return 1.0 if "####" in trace.last_reply else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for i in range(self.config.start, self.config.start + self.config.n):
            a, b = i, 2 * i + 1
            yield ArithTask(ArithData(id=f"sum-{i}", prompt=f"What is {a} + {b}? End with '#### <answer>'.",
                                      system_prompt="You are a careful calculator.", answer=str(a + b)),
                            self.config.task)


__all__ = ["ArithTaskset"]
