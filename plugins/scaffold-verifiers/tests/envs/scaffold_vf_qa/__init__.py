"""A judge-free single-turn verifiers environment: few-shot prompts (earlier turns as messages), an exact
answer reward, and a reward function that configs can plug in (bonus)."""

from __future__ import annotations

import verifiers.v1 as vf

FACTS = [("France", "Paris"), ("Japan", "Tokyo"), ("Peru", "Lima"), ("Kenya", "Nairobi")]


class QAData(vf.TaskData):
    answer: str


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task: QAData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().lower() == task.answer.lower())


async def bonus(trace: vf.Trace) -> float:
    """Plugged through the config: one point for a one-word reply."""
    return float(len(trace.last_reply.split()) == 1)


class QATaskset(vf.Taskset[QATask, vf.TasksetConfig]):
    def load(self):
        shots = [vf.UserMessage(content="Capital of Italy?"), vf.AssistantMessage(content="Rome")]
        for country, city in FACTS:
            yield QATask(QAData(prompt=[*shots, vf.UserMessage(content=f"Capital of {country}?")],
                                system_prompt="Answer with the city only.", answer=city), self.config.task)


__all__ = ["QATaskset"]
