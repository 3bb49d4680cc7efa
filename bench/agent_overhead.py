"""Agent-episode overhead on a canned engine (no model): episodes/s with 3 tool turns each, and the python tool.

Each episode is a real `agent` episode: the engine answers instantly with a canned calculator call three
times, then with the answer; the agent parses each call, runs the `calculator` tool, renders the result
into the conversation through the chat template (the core ByteTokenizer's), checks drift at the end, and
the episode is verified and turned into a `multiturn` trajectory. What is left is scaffold's own cost per
episode (4 generations, 3 tool calls, 3 tool turns rendered). A second table runs the same episodes with
the `python` tool (a fresh sandboxed interpreter per call), whose cold start dominates; its cold start per
call is measured on its own (`print(1)`, median of 20 sequential calls).

    python bench/agent_overhead.py [--episodes 2000]

Not run in CI; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

from scaffold_testkit import ListTask

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.engines.canned import CannedBenchmarkEngine
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.run.assembly import Limits
from scaffold_core.run.runtime import Runtime
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.sampling import SamplingParams
from scaffold_core.task import episode_context
from scaffold_core.tool import ToolContext, invoke_tool
from scaffold_multiturn.agent import AgentController
from scaffold_multiturn.tool_formats import HermesFormat
from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker
from scaffold_tools.calculator import CalculatorTool
from scaffold_tools.python_tool import PythonTool

TOOL_TURNS = 3
CALCULATOR_CALL = ('Let me compute that.\n<tool_call>\n{"name": "calculator", "arguments": '
                   '{"expression": "(6 * 7) + 0"}}\n</tool_call>')
PYTHON_CALL = 'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
ANSWER = "The tool says 42.\n#### 42"


class ToolTurnsEngine(CannedBenchmarkEngine):
    """Canned answers: a tool call for the first ``TOOL_TURNS`` requests of a conversation, then the answer."""

    def __init__(self, call: str):
        super().__init__(response=ANSWER)
        tok = self.tokenizer
        self.call_ids = tok.encode(call) + [tok.eos_token_id]
        self.call_text = call

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests += 1
        nth = int(request.request_id.rsplit("/", 1)[1])  # the conversation's n-th request
        if nth <= TOOL_TURNS:
            ids = self.call_ids[:]
            return GenerationResult(ids, [-0.25] * len(ids), "stop", self.call_text, 0)
        return GenerationResult(self._ids[:], self._logprobs[:], "stop", self.response, 0)


def machine_line() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"machine: {os.cpu_count()} cores, load average {load}, Python {sys.version.split()[0]}"


def contexts(engine: Any, n: int) -> list[Any]:
    task = ListTask([{"id": f"e{i}", "question": f"What is 6 * 7? (problem {i})", "answer": ANSWER}
                     for i in range(n)])
    sampling = SamplingParams(max_tokens=256)
    return [episode_context(task, i, row, engine.tokenizer, sampling) for i, row in enumerate(task.load())]


async def measure(controller: Any, engine: Any, episodes: int, concurrency: int) -> dict[str, float]:
    pool = VerifierPool(ExactMatchVerifier(), timeout=30, workers=2)
    tallies = {"ok": 0, "tool_calls": 0.0, "drift": 0.0}

    def on_result(result: Any) -> None:
        tallies["ok"] += result.ok
        tallies["tool_calls"] += result.metrics.get("tool_calls", 0.0)
        tallies["drift"] += result.metrics.get("drift", 0.0)

    await _start(controller)
    runtime = Runtime(engine=engine, controller=controller, verifier=pool, trajectory_maker=MultiTurnTrajectoryMaker(),
                      limits=Limits(concurrency=concurrency, request_timeout=120))
    start = time.perf_counter()
    try:
        await runtime.run(contexts(engine, episodes), on_result)
    finally:
        wall = time.perf_counter() - start
        pool.close()
        await _close(controller)
    if tallies["ok"] != episodes:
        raise SystemExit(f"only {tallies['ok']} of {episodes} episodes succeeded")
    return {"episodes_per_s": episodes / wall, "wall_s": wall, "tool_calls": tallies["tool_calls"] / episodes,
            "drift": tallies["drift"]}


async def _start(controller: Any) -> None:
    start = getattr(controller, "start", None)
    if start is not None:
        await start()


async def _close(controller: Any) -> None:
    close = getattr(controller, "close", None)
    if close is not None:
        await close()


def agent(tool: Any, drift_check: bool = True) -> AgentController:
    return AgentController(tools=[tool], format=HermesFormat(), max_turns=TOOL_TURNS + 2, drift_check=drift_check)


async def python_cold_start_ms(calls: int = 20) -> tuple[float, float]:
    tool = PythonTool()
    await tool.start()
    times = []
    for i in range(calls + 1):
        start = time.perf_counter()
        result = await invoke_tool(tool, {"code": "print(1)"}, ToolContext("bench", str(i)))
        if not result.ok:
            raise SystemExit(f"the python tool failed: {result.content}")
        if i:  # the first call also compiles the argument schema and warms the page cache
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--python-episodes", type=int, default=48)
    args = parser.parse_args()
    print(machine_line())
    print(f"agent overhead: canned engine, {TOOL_TURNS} tool turns + 1 answer turn per episode, hermes format, "
          "verification and multiturn trajectories included")
    print("(the canned engine speaks through the core's pure-Python ByteTokenizer, whose encoding and decoding of "
          "the growing conversation is about half of the agent's time here; real tokenizers are native code)")
    print(f"{'controller':<34}{'concurrency':>12}{'episodes/s':>12}{'ms/episode':>12}{'tool turns/s':>14}")
    rows = []
    for label, make, engine_call in (
            ("native (1 turn, no tools)", NativeController, None),
            ("agent + calculator", lambda: agent(CalculatorTool()), CALCULATOR_CALL),
            ("agent + calculator, no drift check", lambda: agent(CalculatorTool(), drift_check=False),
             CALCULATOR_CALL)):
        for concurrency in (64, 1024):
            engine = ToolTurnsEngine(engine_call) if engine_call else CannedBenchmarkEngine(response=ANSWER)
            asyncio.run(measure(make(), engine, min(args.episodes, 300), concurrency))  # warm-up
            engine = ToolTurnsEngine(engine_call) if engine_call else CannedBenchmarkEngine(response=ANSWER)
            result = asyncio.run(measure(make(), engine, args.episodes, concurrency))
            if engine_call and (result["tool_calls"] != TOOL_TURNS or result["drift"]):
                raise SystemExit(f"unexpected episodes: {result}")
            rows.append((label, concurrency, result))
            eps = result["episodes_per_s"]
            turns = eps * TOOL_TURNS if engine_call else 0.0
            print(f"{label:<34}{concurrency:>12}{eps:>12,.0f}{1000 / eps:>12.2f}{turns:>14,.0f}", flush=True)

    median, p90 = asyncio.run(python_cold_start_ms())
    print(f"python tool cold start (bubblewrap jail): median {median:.1f} ms, p90 {p90:.1f} ms per call (print(1), "
          "20 sequential calls, fresh interpreter each)")
    for concurrency in (8, 48):
        engine = ToolTurnsEngine(PYTHON_CALL)
        result = asyncio.run(measure(agent(PythonTool()), engine, args.python_episodes, concurrency))
        calls_per_s = result["episodes_per_s"] * TOOL_TURNS
        print(f"agent + python, concurrency {concurrency}: {result['episodes_per_s']:.1f} episodes/s, "
              f"{calls_per_s:.0f} python calls/s ({args.python_episodes} episodes, {TOOL_TURNS} calls each; the "
              "tool runs at most one program per core at a time)", flush=True)


if __name__ == "__main__":
    main()
