"""scaffold-tools against scaffold's conformance kit: each tool keeps the tool contract."""

from __future__ import annotations

from jail_helpers import bubblewrap_or_skip
from scaffold_testkit.conformance import ToolConformance

import scaffold_tools


class TestCalculatorConformance(ToolConformance):
    plugin = scaffold_tools
    name = "calculator"
    calls = [{"expression": "(48 / 2) * 3"}, {"expression": "sqrt(2) ** 2"}, {"expression": "2 ** 10 - 24"}]


class TestPythonConformance(ToolConformance):
    plugin = scaffold_tools
    name = "python"
    calls = [{"code": "print(sum(range(10)))"}, {"code": "import math\nprint(math.factorial(6))"}]
    slow_arguments = {"code": "import time\ntime.sleep(60)"}
    timeout_probe = 1.0

    def make_tool(self):
        bubblewrap_or_skip()  # the default python tool refuses to start without it
        return super().make_tool()


class TestSearchConformance(ToolConformance):
    plugin = scaffold_tools
    name = "search"
    calls = [{"query": "capital of France"}, {"query": "photosynthesis in plants"}]
