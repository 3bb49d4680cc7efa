"""Black-box coding harnesses against the server: OpenAI's Codex CLI (npm ``@openai/codex``, the Responses API) and
Claude Code (npm ``@anthropic-ai/claude-code``, the Messages API), each pointed at a session by its base-URL setting,
complete a scripted task on the canned (scripted) engine (write hello.txt with their shell tool), and their calls are
recorded as one token-faithful conversation.

Each runs where its binary is found: ``$SCAFFOLD_CODEX`` (else ``codex`` on PATH) and ``$SCAFFOLD_CLAUDE_CODE`` (else
``claude`` on PATH), e.g. ``npm install --prefix DIR @openai/codex`` and ``SCAFFOLD_CODEX=DIR/node_modules/.bin/codex``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from compat_matrix import measure, record
from scaffold_testkit import ScriptedEngine
from serve_helpers import last_message, listed_tools, serving

CODEX = os.environ.get("SCAFFOLD_CODEX") or shutil.which("codex")
CLAUDE = os.environ.get("SCAFFOLD_CLAUDE_CODE") or shutil.which("claude")
DONE = "Done: hello.txt holds hi."


def harness_engine(tool: str, arguments: dict) -> ScriptedEngine:
    """The scripted model: call the harness's shell ``tool`` to write the file, then say done."""
    def reply(prompt: str, request) -> str:
        if "<tool_response>" in last_message(prompt):
            return DONE
        assert tool in listed_tools(prompt), listed_tools(prompt)
        return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"

    engine = ScriptedEngine(reply)
    engine.context_length = 1 << 20  # the harnesses' prompts run to tens of thousands of bytes
    return engine


@pytest.fixture
def home() -> Iterator[Path]:
    """The harness's own configuration directory, outside any temporary directory (Codex will not put its sandbox
    helper under one, and its shell commands then fail), removed afterwards."""
    path = Path.home() / ".cache" / f"scaffold-harness-test-{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check(live, sid, proc, work: Path, client: str, mode: str, binary: str) -> None:
    session = live.session(sid)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert DONE in proc.stdout
    written = work / "hello.txt"
    assert written.is_file() and written.read_text() == "hi"
    assert session.counts["calls"] == 2 and len(session.trajectories) == 1 and session.drift_count == 0
    printed = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
    version = re.search(r"\d+\.\d+\S*", printed)
    record(client, mode, "canned", True, measure(session), version=version.group(0) if version else printed.strip())


@pytest.mark.skipif(not CODEX, reason="needs the Codex CLI: npm install @openai/codex, SCAFFOLD_CODEX=<its codex>")
def test_codex_cli_completes_a_scripted_task_and_is_recorded(tmp_path, home):
    work = tmp_path / "work"
    work.mkdir()
    with serving(harness_engine("exec_command", {"cmd": "printf hi > hello.txt"})) as live:
        sid = live.open_session()
        provider = (f'model_providers.scaffold={{name="scaffold", base_url="{live.url}/sessions/{sid}/v1", '
                    'wire_api="responses", env_key="SCAFFOLD_KEY"}')
        proc = subprocess.run(  # the task writes a file: Codex's sandbox lets it write its working directory
            [CODEX, "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "-c", 'model_provider="scaffold"',
             "-c", 'model="scaffold"', "-c", provider, "Create a file hello.txt containing hi."],
            cwd=work, env={**os.environ, "SCAFFOLD_KEY": "none", "CODEX_HOME": str(home)}, capture_output=True,
            text=True, timeout=240, stdin=subprocess.DEVNULL)
        check(live, sid, proc, work, "codex-cli", "exec (responses, streamed), exec_command tool", CODEX)


@pytest.mark.skipif(not CLAUDE, reason="needs Claude Code: npm install @anthropic-ai/claude-code, "
                                       "SCAFFOLD_CLAUDE_CODE=<its claude>")
def test_claude_code_completes_a_scripted_task_and_is_recorded(tmp_path, home):
    work = tmp_path / "work"
    work.mkdir()
    engine = harness_engine("Bash", {"command": "printf hi > hello.txt", "description": "Write hello.txt"})
    with serving(engine) as live:
        sid = live.open_session()
        env = {**os.environ, "ANTHROPIC_BASE_URL": f"{live.url}/sessions/{sid}", "ANTHROPIC_API_KEY": "none",
               "CLAUDE_CONFIG_DIR": str(home), "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        proc = subprocess.run(  # -p: print mode; the task writes a file, and the one command it needs is allowed
            [CLAUDE, "-p", "Create a file hello.txt containing hi.", "--model", "scaffold",
             "--permission-mode", "acceptEdits", "--allowedTools", "Bash(printf:*)"],
            cwd=work, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        check(live, sid, proc, work, "claude-code", "print mode (messages, streamed), Bash tool", CLAUDE)
