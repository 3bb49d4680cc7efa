"""A black-box coding harness against the server: OpenAI's Codex CLI (npm ``@openai/codex``), pointed at a session by
its base-URL setting (a model provider with ``wire_api = "responses"``), completes a scripted task on the canned
(scripted) engine, and its calls are recorded as one token-faithful conversation.

Runs where the ``codex`` binary is found (``$SCAFFOLD_CODEX``, else ``codex`` on PATH):
``npm install --prefix /some/dir @openai/codex`` and ``SCAFFOLD_CODEX=/some/dir/node_modules/.bin/codex``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from compat_matrix import measure, record
from serve_helpers import last_message, listed_tools, serving

from scaffold_core.testing import ScriptedEngine

CODEX = os.environ.get("SCAFFOLD_CODEX") or shutil.which("codex")
pytestmark = pytest.mark.skipif(not CODEX, reason="needs the Codex CLI: npm install @openai/codex, and "
                                                   "SCAFFOLD_CODEX=<path to its codex>")


def harness_reply(prompt: str, request) -> str:
    """The scripted model: run the shell command the task needs with Codex's exec_command tool, then say done."""
    if "<tool_response>" in last_message(prompt):
        return "Done: hello.txt holds hi."
    assert "exec_command" in listed_tools(prompt), listed_tools(prompt)
    call = {"name": "exec_command", "arguments": {"cmd": "printf hi > hello.txt"}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def test_codex_cli_completes_a_scripted_task_and_is_recorded(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # Codex's home, outside any temporary directory: Codex will not put its sandbox helper under one (its shell
    # commands then fail); the task writes a file, so Codex's sandbox lets it write its working directory
    home = Path.home() / ".cache" / f"scaffold-codex-test-{uuid.uuid4().hex[:12]}"
    home.mkdir(parents=True)
    try:
        run_codex(work, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_codex(work: Path, home: Path) -> None:
    version = subprocess.run([CODEX, "--version"], capture_output=True, text=True, timeout=60).stdout.split()[-1]
    with serving(ScriptedEngine(harness_reply)) as live:
        sid = live.open_session()
        provider = (f'model_providers.scaffold={{name="scaffold", base_url="{live.url}/sessions/{sid}/v1", '
                    'wire_api="responses", env_key="SCAFFOLD_KEY"}')
        proc = subprocess.run(
            [CODEX, "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "-c", 'model_provider="scaffold"', "-c", 'model="scaffold"',
             "-c", provider, "Create a file hello.txt containing hi."],
            cwd=work, env={**os.environ, "SCAFFOLD_KEY": "none", "CODEX_HOME": str(home)}, capture_output=True,
            text=True, timeout=240, stdin=subprocess.DEVNULL)
        session = live.session(sid)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Done: hello.txt holds hi." in proc.stdout
        written = work / "hello.txt"
        assert written.is_file() and written.read_text() == "hi", (proc.stdout[-3000:], proc.stderr[-1500:], str(home))
        assert session.counts["calls"] == 2 and len(session.trajectories) == 1 and session.drift_count == 0
        record("codex-cli", "exec (responses, streamed), exec_command tool", "canned", True, measure(session),
               version=version)
