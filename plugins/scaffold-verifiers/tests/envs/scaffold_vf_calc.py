"""A multi-turn tool environment: the model adds numbers with an MCP tool server (a ``vf.Toolset`` the taskset
shares across its rollouts), then answers. Written against the verifiers.v1 public API, as an environment
package is; a module (not a package) so the library can start its tool server with
``python -m scaffold_vf_calc``."""

from __future__ import annotations

import verifiers.v1 as vf
from verifiers.v1.types import content_text


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: CalcData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().endswith(task.answer))

    @vf.reward(weight=0.5)
    async def used_tool(self, task: CalcData, trace: vf.Trace) -> float:
        return float(any(content_text(m.content).strip() == task.answer for m in trace.tool_messages))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class CalcConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    def load(self):
        for a, b in ((2, 3), (20, 22)):
            yield CalcTask(CalcData(id=f"add-{a}-{b}", prompt=f"What is {a} + {b}? Use the tool.",
                                    answer=str(a + b)), self.config.task)


__all__ = ["CalcTaskset"]

if __name__ == "__main__":
    CalcToolset.run()
