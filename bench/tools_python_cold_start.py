"""Cold start of the `python` tool: milliseconds per call of `print(1)` (median and p90 of 20 sequential calls),
through invoke_tool, in the bubblewrap jail (the default) and with isolation: none, next to a bare
`python -I -S -c pass` of the same interpreter.

Every call starts a fresh interpreter in a fresh jail (namespaces, mounts, a tmpfs work directory), so this
is the fixed cost an agent pays per code execution. Goal for the jailed call: median <= 60 ms. The load
average is printed: on a shared machine it moves every figure (run it under `nice -n -15` to see roughly what
an idle machine gives). Not run in CI: `python bench/tools_python_cold_start.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import statistics
import subprocess
import sys
import time

from scaffold_core.tool import ToolContext, invoke_tool
from scaffold_tools.python_tool import PythonTool

CALLS = 20
GOAL_MS = 60.0


def machine_line() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"machine: {os.cpu_count()} cores, load average {load}, Python {sys.version.split()[0]}"


def bare_ms(python: str) -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        subprocess.run([python, "-I", "-S", "-c", "pass"], check=True, timeout=60)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def tool_ms(tool: PythonTool) -> tuple[float, float]:
    """(median, p90) wall-clock milliseconds per call."""
    with contextlib.redirect_stderr(io.StringIO()):  # isolation: none's warning is not a figure
        await tool.start()
    times = []
    for i in range(CALLS + 1):
        start = time.perf_counter()
        result = await invoke_tool(tool, {"code": "print(1)"}, ToolContext("bench", str(i)))
        elapsed = (time.perf_counter() - start) * 1000
        if not result.ok or result.content != "1\n":
            raise SystemExit(f"the python tool failed: {result.content}")
        if i:  # the first call also pays for compiling the argument schema and warming the page cache
            times.append(elapsed)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


def main() -> None:
    print(machine_line())
    jailed = PythonTool()
    try:
        median, p90 = asyncio.run(tool_ms(jailed))
    except Exception as exc:  # no bubblewrap here: say so, measure the rest
        print(f"python tool in the bubblewrap jail: not available ({exc})")
    else:
        verdict = "meets" if median <= GOAL_MS else "misses"
        print(f"python tool cold start, bubblewrap jail (default): median {median:.1f} ms, p90 {p90:.1f} ms per call "
              f"(print(1), {CALLS} sequential calls; {verdict} the goal of {GOAL_MS:g} ms)")
        assert jailed._jail is not None
        print(f"bare `python -I -S -c pass` (the jail's interpreter): "
              f"{bare_ms(jailed._jail.root.runtime.executable):.1f} ms (median of {CALLS})")
    median, p90 = asyncio.run(tool_ms(PythonTool(isolation="none")))
    print(f"python tool cold start, isolation: none: median {median:.1f} ms, p90 {p90:.1f} ms per call")


if __name__ == "__main__":
    main()
