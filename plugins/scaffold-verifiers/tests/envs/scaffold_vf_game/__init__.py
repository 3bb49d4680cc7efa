"""A multi-turn verifiers environment: its own Env plays a game with the agent over several turns."""

from __future__ import annotations

import verifiers.v1 as vf


class GameTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="Let's play."), self.config.task)


class GameEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        for _ in range(3):
            await agents.agent.run(task)


__all__ = ["GameEnv", "GameTaskset"]
