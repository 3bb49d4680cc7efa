"""A code rubric, shaped like the library's code-golf environments: a metric that takes the ``runtime`` writes the
model's program there and runs it (``python3 solution.py``), a reward reads whether it printed what was asked,
and the environment plays several attempts per task. Here the runtime is scaffold's jail by default."""

from __future__ import annotations

import asyncio
import re

import verifiers.v1 as vf

SPECS = [("sum", "the sum of the integers 1 to 100", "5050"),
         ("reverse", "the string HELLO reversed", "OLLEH"),
         ("secret", "the text of the file named in SCAFFOLD_GOLF_SECRET", "")]


def program_of(trace: vf.Trace) -> str:
    found = re.search(r"```(?:python)?\n(.*?)```", trace.last_reply or "", re.DOTALL)
    return (found.group(1) if found else trace.last_reply or "").strip()


class GolfData(vf.TaskData):
    expected: str


class GolfTask(vf.Task[GolfData]):
    @vf.metric
    async def evaluate(self, trace: vf.Trace, runtime: vf.Runtime) -> dict[str, float]:
        program = program_of(trace)
        await runtime.write("solution.py", program.encode())
        result = await runtime.run(["python3", "solution.py"], {})
        passed = result.exit_code == 0 and result.stdout.strip() == self.data.expected
        return {"passed": float(passed), "length": float(len(program))}

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return trace.metrics.get("passed", 0.0)


class GolfConfig(vf.TasksetConfig):
    secret: str = ""


class GolfTaskset(vf.Taskset[GolfTask, GolfConfig]):
    def load(self):
        for name, what, expected in SPECS:
            yield GolfTask(GolfData(id=name, prompt=f"Write a Python program that prints {what}.",
                                    expected=expected or self.config.secret), self.config.task)


class GolfEnvConfig(vf.EnvConfig):
    golfer: vf.AgentConfig = vf.AgentConfig()
    attempts: int = 2


class GolfEnv(vf.Env[GolfEnvConfig]):
    async def run(self, task, agents):
        async with asyncio.TaskGroup() as group:
            for _ in range(self.config.attempts):
                group.create_task(agents.golfer.run(task))


__all__ = ["GolfEnv", "GolfTaskset"]
