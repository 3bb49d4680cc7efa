"""The tool conformance class fails on tools that break the tool contract, each with a message naming the fault."""

from __future__ import annotations

pytest_plugins = ["pytester"]

BROKEN_TOOLS = '''
import time

from scaffold_testkit.conformance import ToolConformance
from scaffold_core.tool import Tool, ToolResult

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
          "additionalProperties": False}


class Good(Tool):
    name = "echo"
    description = "Echo the text."
    parameters = SCHEMA

    async def call(self, arguments, context):
        return ToolResult(arguments["text"])


class NoDescription(Good):
    description = ""


class ClassLevelLog(Good):
    log = []

    async def call(self, arguments, context):
        self.log.append(arguments["text"])
        return ToolResult(arguments["text"])


class CountsCalls(Good):
    def __init__(self):
        self.calls = 0

    async def call(self, arguments, context):
        self.calls += 1
        return ToolResult(f"{arguments['text']} (call {self.calls})")


class BlocksTheLoop(Good):
    timeout = 0.2

    async def call(self, arguments, context):
        if arguments["text"] == "slow":
            time.sleep(3)
        return ToolResult(arguments["text"])


class Base(ToolConformance):
    calls = [{"text": "hello"}]


class TestGood(Base):

    def make_tool(self):
        return Good()


class TestNoDescription(Base):
    def make_tool(self):
        return NoDescription()


class TestClassLevelLog(Base):
    def make_tool(self):
        return ClassLevelLog()


class TestCountsCalls(Base):
    def make_tool(self):
        return CountsCalls()


class TestBlocksTheLoop(Base):
    slow_arguments = {"text": "slow"}
    timeout_probe = 0.1

    def make_tool(self):
        return BlocksTheLoop()
'''


def test_tool_conformance_catches_broken_tools(pytester):
    pytester.makepyfile(test_subject=BROKEN_TOOLS)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    text = result.stdout.str()
    outcomes = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            outcomes.setdefault(report.outcome, set()).add(report.nodeid.split("::", 1)[1])
    failed = outcomes.get("failed", set())
    assert not {f for f in failed if f.startswith("TestGood::")}, text
    assert "TestNoDescription::test_definition_is_valid" in failed, text
    assert "TestClassLevelLog::test_no_class_level_mutable_state" in failed, text
    assert "class-level mutable state" in text
    assert "TestCountsCalls::test_concurrent_calls_agree_with_serial_ones" in failed, text
    assert "TestCountsCalls::test_a_copied_tool_answers_as_the_original" in failed, text
    assert "state leaks between episodes" in text
    assert "TestBlocksTheLoop::test_timeout_is_respected" in failed, text
