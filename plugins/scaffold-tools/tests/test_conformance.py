"""The built-in tools pass the tool conformance kit, as every tool plugin's should."""

from __future__ import annotations

import scaffold_tools
from scaffold_core.testing.conformance import ToolConformance


class TestCalculator(ToolConformance):
    plugin = scaffold_tools
    name = "calculator"
    good_arguments = [{"expression": "(48 / 2) * 3 + sqrt(16)"}, {"expression": "2 ** 10"}]


class TestPython(ToolConformance):
    plugin = scaffold_tools
    name = "python"
    options = {"timeout": 5.0}
    good_arguments = [{"code": "print(sum(range(10)))"}]
    slow_arguments = {"code": "import time\ntime.sleep(60)"}
    timeout_probe = 1.0


class TestSearch(ToolConformance):
    plugin = scaffold_tools
    name = "search"
    good_arguments = [{"query": "how many feet in a mile"}, {"query": "boiling point of water"}]
