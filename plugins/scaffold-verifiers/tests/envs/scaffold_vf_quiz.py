"""A multi-turn verifiers environment with a judge rubric: its own ``Env`` plays the user (it questions the
model's first answer, and the model answers again), and the task scores the final answer with a plugged
reference judge (an LLM call) plus a reward function. Written against the verifiers.v1 public API."""

from __future__ import annotations

import verifiers.v1 as vf

CHALLENGE = "Are you sure? Answer again, with the city only."


class QuizData(vf.TaskData):
    answer: str


class QuizTask(vf.Task[QuizData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def concise(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()) == 1)

    @vf.metric
    async def user_turns(self, trace: vf.Trace) -> float:
        return float(sum(1 for m in trace.branches[-1].messages if m.role == "user"))


class QuizConfig(vf.TasksetConfig):
    task: vf.TaskConfig = vf.TaskConfig(judges=[{"id": "reference"}])


class QuizTaskset(vf.Taskset[QuizTask, QuizConfig]):
    def load(self):
        for country, city in (("France", "Paris"), ("Japan", "Tokyo")):
            yield QuizTask(QuizData(id=country.lower(), prompt=f"What is the capital of {country}?",
                                    system_prompt="You answer geography questions.", answer=city),
                           self.config.task)


class QuizEnvConfig(vf.EnvConfig):
    student: vf.AgentConfig = vf.AgentConfig()


class QuizEnv(vf.Env[QuizEnvConfig]):
    """The environment is the user: it hears the model's answer, then challenges it once."""

    async def run(self, task, agents):
        async with agents.student.interaction(task) as talk:
            segment = await talk.turn()
            if not segment.terminated:
                await talk.turn(CHALLENGE)


__all__ = ["QuizEnv", "QuizTaskset"]
