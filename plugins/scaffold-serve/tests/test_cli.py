"""`scaffold serve CONFIG` as a user runs it: refused beyond loopback without a key (before any model loads), and on
the canned engine it serves, records, writes finished sessions, and on Ctrl-C writes the open ones and exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

httpx = pytest.importorskip("httpx")

CONFIG = {"task": {"name": "gsm8k", "source": "sample", "split": "test", "limit": 1},
          "engine": {"name": "benchmark_canned"}, "sampling": {"max_tokens": 64},
          "controller": {"name": "openai_agent", "entry": "agents:solve", "model_name": "canned"}}


def scaffold(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "scaffold_core.cli", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_beyond_loopback_without_a_key_is_refused_before_anything_loads(config, tmp_path):
    proc = scaffold("serve", str(config), "--host", "0.0.0.0", "--port", "0", "-o", str(tmp_path / "out"),
                    env={**os.environ, "SCAFFOLD_API_KEY": ""})
    assert proc.returncode != 0
    assert "refusing to serve on 0.0.0.0 without an API key" in proc.stderr and "--api-key" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def start(config, out):
    """``scaffold serve`` in a process of its own: (the process, its URL, its banner)."""
    proc = subprocess.Popen([sys.executable, "-m", "scaffold_core.cli", "serve", str(config), "--port", "0",
                             "-o", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = line = None
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"at (http://\S+)/v1 ", line)
        url = found.group(1) if found else None
        if not line and proc.poll() is not None:
            break
    return proc, url, line


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    proc.stderr.close()


def test_serve_records_sessions_and_writes_them(config, tmp_path):
    out = tmp_path / "out"
    proc, url, _ = start(config, out)
    try:
        assert url is not None, "scaffold serve did not start"
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["canned"]
        first, second = (httpx.post(f"{url}/sessions", timeout=10).json()["id"] for _ in range(2))
        for sid in (first, second):
            reply = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", timeout=10, json={
                "model": "canned", "messages": [{"role": "user", "content": "What is 6 times 7?"}]})
            assert reply.status_code == 200
        done = httpx.post(f"{url}/sessions/{first}/finish", json={"answer": "42", "reward": 1.0}, timeout=10).json()
        assert done["reward"] == 1.0 and done["samples"] == 1
        assert httpx.get(f"{url}/sessions/{first}", timeout=10).status_code == 404  # finished: no longer open
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    lines = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == [first, second]
    finished, open_one = lines
    assert finished["verdict"]["reward"] == 1.0 and len(finished["samples"]) == 1
    sample = finished["samples"][0]
    assert sum(sample["loss_mask"]) == len(finished["calls_log"][0]["choices"][0]["output_ids"])
    assert open_one["verdict"]["reward"] is None and open_one["samples"] == []  # unscored: never 0


def test_a_config_with_only_an_engine_serves_and_records_sessionless_calls(tmp_path):
    """No task: the prompts and rewards are the clients'. Calls to the banner's /v1 land in the session it names;
    routes that are not served say what is."""
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump({"engine": {"name": "benchmark_canned"}, "sampling": {"max_tokens": 64}}))
    out = tmp_path / "out"
    proc, url, banner = start(config, out)
    try:
        assert url is not None, "scaffold serve did not start"
        assert "recorded into session 'default'" in banner
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
            "model": "scaffold", "messages": [{"role": "user", "content": "Hi"}], "stop": ["42"]})
        assert reply.json()["choices"][0]["message"]["content"] == "Adding them gives "  # the stop string cut
        assert httpx.post(f"{url}/sessions/default/reward", json={"reward": 0.5}, timeout=10).status_code == 200
        missing = httpx.post(f"{url}/v1/completions", json={"model": "scaffold", "prompt": "Hi"}, timeout=10)
        assert missing.status_code == 404 and "POST /v1/responses" in missing.json()["error"]["message"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    (line,) = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert line["id"] == "default" and line["calls"] == 1 and line["verdict"]["reward"] == 0.5
    assert line["samples"][0]["reward"] == 0.5


def test_serve_comes_from_the_plugin_through_register_commands(monkeypatch, capsys):
    from scaffold_core.cli.main import main

    monkeypatch.setenv("SCAFFOLD_DISABLE_PLUGINS", "serve")
    from scaffold_core.plugins import get_plugins

    get_plugins(reload=True)
    try:
        with pytest.raises(SystemExit):
            main(["serve", "any.yaml"])
        assert "invalid choice: 'serve'" in capsys.readouterr().err
    finally:
        monkeypatch.delenv("SCAFFOLD_DISABLE_PLUGINS")
        get_plugins(reload=True)
    assert main(["serve", "missing.yaml"]) != 0
    assert "invalid choice" not in capsys.readouterr().err
