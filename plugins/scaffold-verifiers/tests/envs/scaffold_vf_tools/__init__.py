"""A verifiers environment whose tasks give the model a tool server: not single-turn."""

from __future__ import annotations

import verifiers.v1 as vf


class ToolTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [object()]  # a tool server (only its presence matters here)

    @vf.reward
    async def done(self, trace: vf.Trace) -> float:
        return 1.0


class ToolTaskset(vf.Taskset[ToolTask, vf.TasksetConfig]):
    def load(self):
        yield ToolTask(vf.TaskData(prompt="Use the tool."), self.config.task)


__all__ = ["ToolTaskset"]
