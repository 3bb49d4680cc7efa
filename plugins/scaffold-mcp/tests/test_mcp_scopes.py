"""MCP servers scoped per run or per episode, servers in an environment of their own, and an SDK this plugin
cannot drive (1.x) failing at once with the real cause."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import scaffold_mcp
from scaffold_mcp.toolset import McpToolSet
from scaffold_testkit import ListTask, ScriptedEngine, make_contexts, plugin_set, run_episodes

import scaffold_multiturn
from scaffold_core.errors import ConfigError, MissingDependencyError
from scaffold_core.sampling import SamplingParams
from scaffold_core.tool import ToolContext, invoke_tool

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
STDIO = [sys.executable, SERVER]


def run(coro: Any, timeout: float = 90.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_episode_scope_gives_each_episode_its_own_server_stopped_when_the_episode_is_done():
    tool_set = McpToolSet(server=STDIO, scope="episode")

    async def body():
        await tool_set.start()
        try:
            whoami = next(t for t in tool_set.tools() if t.name == "whoami")
            first, second = {}, {}

            async def pid(state):
                return int((await invoke_tool(whoami, {}, ToolContext("ep", "c", state=state))).content)

            one, again, two = await pid(first), await pid(first), await pid(second)
            assert tool_set.connection is None  # the server that listed the tools is gone: none is shared
            del first
            gc.collect()
            for _ in range(100):  # the episode let its state go: its server stops, the other's runs on
                await asyncio.sleep(0.05)
                if not alive(one):
                    break
            return one, again, two, alive(one), alive(two)
        finally:
            await tool_set.close()

    one, again, two, one_alive, two_alive = run(body())
    assert one == again and one != two
    assert not one_alive and two_alive
    time.sleep(0.2)
    assert not alive(two)  # the run's end stops every episode's server


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.mark.parametrize("scope", ["run", "episode"])
def test_agents_share_the_runs_server_or_each_get_their_own(scope):
    from scaffold_core.builtins.verifiers import ExactMatchVerifier
    from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker

    registry = plugin_set(mcp=scaffold_mcp, multiturn=scaffold_multiturn).registry
    agent = registry.create("controller", "agent", {"tools": [{"name": "mcp", "server": STDIO, "scope": scope}],
                                                   "max_turns": 2}, path="controller")
    def script(prompt: str, request: Any) -> str:  # call whoami, then answer with the pid it gave
        if prompt.count("<|assistant|>") == 1:
            return _call("whoami")
        return re.findall(r"<tool_response>\s*(\d+)\s*</tool_response>", prompt)[-1]

    engine = ScriptedEngine(script)
    contexts = make_contexts(ListTask([{"id": str(i), "question": "who?", "answer": "ok"} for i in range(3)]),
                             engine.tokenizer, SamplingParams(max_tokens=100, temperature=1.0))
    results = run_episodes(contexts, engine=engine, controller=agent, verifier=ExactMatchVerifier(),
                           trajectory_maker=MultiTurnTrajectoryMaker(), timeout=120)
    assert all(r.ok for r in results), [r.error for r in results]
    pids = {int(r.samples[0].text) for r in results}
    assert len(pids) == (1 if scope == "run" else 3)
    assert not any(alive(p) for p in pids)


def test_a_server_runs_in_a_virtual_environment_of_its_own(tmp_path):
    """``venv``: the command's interpreter is the environment's (here one made for the test, seeing this one's
    packages through a .pth file, as a server's own environment would have its own)."""
    venv = tmp_path / "server-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages")]
    (site / "scaffold_test.pth").write_text("\n".join(here) + "\n")
    tool_set = McpToolSet(server={"command": f"python {SERVER}", "venv": str(venv)})

    async def body():
        await tool_set.start()
        try:
            where = next(t for t in tool_set.tools() if t.name == "where")
            return (await invoke_tool(where, {}, ToolContext("ep", "c"))).content
        finally:
            await tool_set.close()

    assert Path(run(body())).resolve() == venv.resolve()
    with pytest.raises(ValueError, match="is not a virtual environment"):
        McpToolSet(server={"command": "python x.py", "venv": str(tmp_path)})


def test_an_mcp_sdk_it_cannot_drive_fails_at_once_naming_the_cause(monkeypatch):
    """An mcp 1.x SDK (no Client): the tool set is refused when it is built, in one line naming the installed
    release and the fix, instead of a run that waits out the start-up timeout and blames the server."""
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "1.26.0" if name == "mcp" else real(name))
    started = time.monotonic()
    with pytest.raises(MissingDependencyError, match=r"needs the mcp SDK 2\.x; mcp 1\.26\.0 is installed: "
                                                     r"pip install 'mcp>=2,<3'") as info:
        McpToolSet(server=STDIO)
    assert time.monotonic() - started < 2 and "\n" not in str(info.value)
    assert scaffold_mcp.plugin_notes() == [f"mcp tool: cannot run: {info.value}"]
    monkeypatch.undo()
    assert scaffold_mcp.plugin_notes() == []


def test_bad_scope_is_a_config_error():
    registry = plugin_set(mcp=scaffold_mcp).registry
    with pytest.raises(ConfigError, match="scope"):
        registry.create("tool", "mcp", {"server": STDIO, "scope": "global"}, path="tools[0]")
