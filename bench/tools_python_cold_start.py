"""Cold start of the `python` tool: milliseconds per call of `print(1)` (median of 20 sequential calls),
through invoke_tool, with and without the network namespace, next to a bare `python -I -S -c pass`.

Every call starts a fresh interpreter in a fresh directory, so this is the fixed cost an agent pays per
code execution. Not run in CI: `python bench/tools_python_cold_start.py`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

from scaffold_core.tool import ToolContext, invoke_tool
from scaffold_tools.python_tool import PythonTool
from scaffold_tools.sandbox import namespaces_available

CALLS = 20


def machine_line() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"machine: {os.cpu_count()} cores, load average {load}, Python {sys.version.split()[0]}"


def bare_ms() -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True, timeout=60)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def tool_ms(namespaces: str) -> tuple[float, float]:
    tool = PythonTool(namespaces=namespaces)
    await tool.start()
    times = []
    for i in range(CALLS + 1):
        start = time.perf_counter()
        result = await invoke_tool(tool, {"code": "print(1)"}, ToolContext("bench", str(i)))
        elapsed = (time.perf_counter() - start) * 1000
        if not result.ok or result.content != "1\n":
            raise SystemExit(f"the python tool failed: {result.content}")
        if i:  # the first call also pays for checking namespaces and warming the page cache
            times.append(elapsed)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


def main() -> None:
    print(machine_line())
    print(f"bare `python -I -S -c pass`: {bare_ms():.1f} ms (median of {CALLS})")
    modes = ["off"] + (["on"] if namespaces_available() else [])
    for mode in modes:
        median, p90 = asyncio.run(tool_ms(mode))
        label = "with network namespace" if mode == "on" else "without namespaces"
        print(f"python tool cold start, {label}: median {median:.1f} ms, p90 {p90:.1f} ms per call "
              f"(print(1), {CALLS} sequential calls)")
    if "on" not in modes:
        print("network namespace: not available on this host (unshare --user --net fails)")


if __name__ == "__main__":
    main()
