"""The ``mcp`` tool against a real MCP server written with the SDK (tests/mcp_test_server.py), over stdio and
streamable HTTP: listed, called, cleaned up (no process or port left); a dead server gives tool errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import scaffold_mcp
from scaffold_mcp.toolset import McpStartError, McpToolSet
from scaffold_testkit import ListTask, ScriptedEngine, make_contexts, plugin_set, run_episodes
from scaffold_testkit.conformance import ToolConformance

import scaffold_multiturn
from scaffold_core.errors import ConfigError
from scaffold_core.sampling import SamplingParams
from scaffold_core.tool import ToolContext, check_tool, invoke_tool, is_tool_set

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
STDIO = [sys.executable, SERVER]
HTTP = {"command": [sys.executable, SERVER, "http", "{port}"], "url": "http://127.0.0.1:{port}/mcp"}
CTX = ToolContext(episode_id="ep", call_id="call")


def run(coro: Any, timeout: float = 90.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class TestMcpToolConformance(ToolConformance):
    """The server's `wait` tool keeps the tool contract, a call past its timeout included (each test starts and
    stops the server)."""

    plugin = scaffold_mcp
    name = "mcp"
    options: ClassVar[dict[str, Any]] = {"server": STDIO, "timeout": 20}
    calls = [{"seconds": 0.01}, {"seconds": 0.02}]
    slow_arguments = {"seconds": 30}
    timeout_probe = 1.0
    time_limit = 90.0
    _listed: ClassVar[Any] = None

    def make_tool(self) -> Any:
        """The set's `wait` tool; its definition listed once from a real start of the server."""
        from scaffold_mcp.toolset import McpTool

        if TestMcpToolConformance._listed is None:
            tool_set = self.build()

            async def listed():
                await tool_set.start()
                try:
                    return next(t for t in tool_set.connection.listed if t.name == "wait")
                finally:
                    await tool_set.close()

            TestMcpToolConformance._listed = run(listed())
        return McpTool(self.build(), TestMcpToolConformance._listed)


def test_the_registered_component_is_a_tool_set_of_the_servers_tools():
    registry = plugin_set(mcp=scaffold_mcp).registry
    tool_set = registry.create("tool", "mcp", {"server": STDIO}, path="tools[0]")
    assert is_tool_set(tool_set)

    async def body():
        await tool_set.start()
        try:
            tools = {t.name: t for t in tool_set.tools()}
            for tool in tools.values():
                check_tool(tool)
            pid = int((await invoke_tool(tools["whoami"], {}, CTX)).content)
            return tools, pid, await invoke_tool(tools["text_upper"], {"text": "mcp"}, CTX), \
                await invoke_tool(tools["refuse"], {"reason": "no way"}, CTX)
        finally:
            await tool_set.close()

    tools, pid, upper, refused = run(body())
    # '.' is not a tool name
    assert sorted(tools) == ["add", "crash", "refuse", "text_upper", "wait", "where", "whoami"]
    assert tools["add"].description == "Add two integers and return their sum."
    assert tools["add"].parameters["required"] == ["a", "b"]
    assert tools["text_upper"].remote_name == "text.upper" and upper.content == "MCP"
    assert not refused.ok and refused.error == "failed" and "no way" in refused.content
    assert not alive(pid), "the stdio server outlived the run"


def test_an_http_server_started_with_the_run_is_listed_called_and_stopped():
    tool_set = McpToolSet(server=HTTP, tools=["add", "whoami"], prefix="calc_")

    async def body():
        await tool_set.start()
        try:
            port = int(re.search(r":(\d+)/mcp", tool_set.connection.spec.url).group(1))
            tools = {t.name: t for t in tool_set.tools()}
            pid = int((await invoke_tool(tools["calc_whoami"], {}, CTX)).content)
            added = await asyncio.gather(*(invoke_tool(tools["calc_add"], {"a": i, "b": i}, CTX) for i in range(5)))
            return port, pid, sorted(tools), [r.content for r in added]
        finally:
            await tool_set.close()

    port, pid, names, added = run(body())
    assert names == ["calc_add", "calc_whoami"]
    assert added == ["0", "2", "4", "6", "8"]
    assert not alive(pid) and not listening(port), "the HTTP server's process or port outlived the run"


def test_an_http_url_is_connected_to_and_left_running(tmp_path):
    """A URL alone names a server someone else runs: scaffold connects and leaves it running."""
    import subprocess

    port = scaffold_mcp.servers.free_port()
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not listening(port):
            assert time.monotonic() < deadline and process.poll() is None, "the test server did not start"
            time.sleep(0.1)
        tool_set = McpToolSet(server=f"http://127.0.0.1:{port}/mcp")

        async def body():
            await tool_set.start()
            try:
                add = next(t for t in tool_set.tools() if t.name == "add")
                return (await invoke_tool(add, {"a": 40, "b": 2}, CTX)).content
            finally:
                await tool_set.close()

        assert run(body()) == "42"
        assert process.poll() is None and listening(port)
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.mark.parametrize("server", [STDIO, HTTP], ids=["stdio", "http"])
def test_a_server_that_dies_mid_run_gives_tool_errors_at_once(server):
    tool_set = McpToolSet(server=server, timeout=20)

    async def body():
        await tool_set.start()
        try:
            tools = {t.name: t for t in tool_set.tools()}
            pid = int((await invoke_tool(tools["whoami"], {}, CTX)).content)
            crashed = await invoke_tool(tools["crash"], {}, CTX)
            began = time.monotonic()
            after = await invoke_tool(tools["add"], {"a": 1, "b": 2}, CTX)
            return pid, crashed, after, time.monotonic() - began
        finally:
            await tool_set.close()

    pid, crashed, after, took = run(body())
    assert not crashed.ok and not after.ok and after.error == "failed"
    assert "MCP server" in after.content
    assert took < 5.0, f"a call to a dead server took {took:.1f} s"
    assert not alive(pid)


@pytest.mark.parametrize("server, message", [
    ([sys.executable, "-c", "import sys; sys.stderr.write('no config here\\n'); sys.exit(2)"],
     r"failed to start: .*; its stderr: no config here"),
    (["/no/such/server-binary"], r"failed to start: .*No such file"),
    ({"command": [sys.executable, "-c", "raise SystemExit(5)"], "url": "http://127.0.0.1:{port}/mcp"},
     r"failed to start: it exited with code 5 before serving http://127\.0\.0\.1:\d+/mcp"),
], ids=["exits", "missing", "http-exits"])
def test_a_server_that_cannot_start_is_a_one_line_start_error(server, message):
    tool_set = McpToolSet(server=server, startup_timeout=30)
    with pytest.raises(McpStartError, match=message) as info:
        run(tool_set.start())
    assert "\n" not in str(info.value)
    run(tool_set.close())


def test_a_server_that_never_answers_is_stopped_at_the_startup_timeout():
    hang = [sys.executable, "-c", "import os, sys, time; print(os.getpid(), file=sys.stderr, flush=True); "
                                  "time.sleep(300)"]
    tool_set = McpToolSet(server=hang, startup_timeout=2)
    began = time.monotonic()
    with pytest.raises(McpStartError, match=r"did not list its tools within 2 s .*; its stderr: (\d+)") as info:
        run(tool_set.start())
    assert time.monotonic() - began < 10  # the startup timeout, then the stop: no graceful wait on a mute server
    pid = int(re.search(r"its stderr: (\d+)", str(info.value)).group(1))
    assert not alive(pid), "the hung server was left running"


@pytest.mark.parametrize("server, message", [
    ("", "server is empty"), ({"url": "ftp://x"}, "must be an http"), ({"cmd": "x"}, "unknown key"),
    (42, r"tools\[0\]\.server"), ({"args": ["a"]}, "needs a command"),
])
def test_bad_server_options_are_config_errors(server, message):
    registry = plugin_set(mcp=scaffold_mcp).registry
    with pytest.raises(ConfigError, match=message):
        registry.create("tool", "mcp", {"server": server}, path="tools[0]")


def test_a_tool_the_server_does_not_list_fails_the_start():
    with pytest.raises(McpStartError, match=r"has no tool 'mul'; it lists: add, "):
        run(McpToolSet(server=STDIO, tools=["mul"]).start())


# -- the agent, end to end -----------------------------------------------------------------------------


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _agent_run(server: Any, script: Any, rows: list[dict[str, Any]]) -> list[Any]:
    from scaffold_core.builtins.verifiers import ExactMatchVerifier
    from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker

    registry = plugin_set(mcp=scaffold_mcp, multiturn=scaffold_multiturn).registry
    agent = registry.create("controller", "agent", {"tools": [{"name": "mcp", "server": server}], "max_turns": 3},
                            path="controller")
    engine = ScriptedEngine(script)
    contexts = make_contexts(ListTask(rows), engine.tokenizer, SamplingParams(max_tokens=200, temperature=1.0))
    return run_episodes(contexts, engine=engine, controller=agent, verifier=ExactMatchVerifier(),
                        trajectory_maker=MultiTurnTrajectoryMaker(), timeout=120)


def _turn(prompt: str) -> int:
    return prompt.count("<|assistant|>") - 1


def test_an_agent_calls_the_servers_tools_and_answers():
    def script(prompt: str, request: Any) -> str:
        if _turn(prompt) == 0:
            a, b = map(int, re.findall(r"(\d+) \+ (\d+)", prompt)[-1])
            return _call("add", a=a, b=b)
        return re.findall(r"<tool_response>\s*(\S+?)\s*</tool_response>", prompt)[-1]

    results = _agent_run(STDIO, script, [{"id": str(i), "question": f"{i} + {2 * i}", "answer": str(3 * i)}
                                         for i in range(1, 4)])
    for result in results:
        assert result.ok, result.error
        sample = result.samples[0]
        assert sample.reward == 1.0
        assert [c["name"] for c in sample.metadata["tool_calls"]] == ["add"]
        assert sample.metadata["tool_calls"][0]["ok"]
        assert 0 in sample.output_mask and 1 in sample.output_mask  # the result is environment tokens


def test_an_agent_whose_server_dies_gets_tool_errors_and_completes():
    def script(prompt: str, request: Any) -> str:
        turn = _turn(prompt)
        if turn == 0:
            return _call("crash")
        if turn == 1:
            return _call("add", a=1, b=2)
        return "3"

    [result] = _agent_run(STDIO, script, [{"id": "dead", "question": "1 + 2", "answer": "3"}])
    assert result.ok, result.error
    calls = result.samples[0].metadata["tool_calls"]
    assert [(c["name"], c["ok"]) for c in calls] == [("crash", False), ("add", False)]
    assert result.samples[0].reward == 1.0
    assert result.metrics["tool_errors"] == 2.0


def test_results_are_the_text_of_the_content_cut_to_max_output_chars():
    import mcp_types
    from scaffold_mcp.toolset import _result

    long = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="x" * 500)])
    cut = _result(long, 100)
    assert cut.ok and cut.content.startswith("x" * 100 + "\n[output cut: 500 characters, the first 100 shown]")
    image = mcp_types.CallToolResult(content=[mcp_types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
                                              mcp_types.TextContent(type="text", text="a chart")])
    assert _result(image, 1000).content == "[image image/png content]\na chart"
    failed = _result(mcp_types.CallToolResult(content=[], is_error=True), 1000)
    assert not failed.ok and failed.content == "the MCP tool reported an error"
