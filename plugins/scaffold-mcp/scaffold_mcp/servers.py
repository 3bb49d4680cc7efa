"""Which MCP server a config names, and the HTTP server processes started with a run.

The ``server`` option takes three shapes:

* a command (a string, split like a shell would, or a list): a **stdio** server, started with the
  run and stopped at its end by the SDK's stdio client;
* a URL (``http://...`` or ``https://...``): a **streamable-HTTP** server someone else runs;
* a mapping ``{command: ..., args: [...], env: {...}, cwd: ..., url: ..., venv: ...}``: with ``url`` and
  ``command`` together, scaffold starts the command, waits until the URL's port accepts connections
  and connects over streamable HTTP; ``{port}`` in the command and the URL is replaced by a free
  loopback port. Without ``url``, the command is a stdio server.

A server may live in an interpreter and environment of its own (its SDK pins may clash with this one's):
``venv`` names a virtual environment (or an interpreter inside one), whose ``bin`` the command's first word is
looked up in first (``python`` is its interpreter, console scripts are its own) and which is the server's
``VIRTUAL_ENV`` and the head of its ``PATH``; or the command is a runner that makes the environment itself,
such as ``uvx mcp-server-time`` or ``pipx run mcp-server-time``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import IO, Any
from urllib.parse import urlsplit

#: Keys of the mapping form.
SERVER_KEYS = ("command", "args", "env", "cwd", "url", "venv")


@dataclass(frozen=True)
class ServerSpec:
    """A server as the config names it: a command to start, a URL to connect to, or both."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.url is None else "http"

    @property
    def label(self) -> str:
        """How messages name the server."""
        if self.command:
            shown = shlex.join(self.command)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return f"`{shown}`" + (f" ({self.url})" if self.url else "")
        return str(self.url)

    def with_free_port(self) -> ServerSpec:
        """``{port}`` in the command and the URL replaced by a free loopback port (unchanged without one)."""
        if not any("{port}" in part for part in (*self.command, self.url or "")):
            return self
        port = str(free_port())
        return replace(self, command=tuple(part.replace("{port}", port) for part in self.command),
                       url=self.url.replace("{port}", port) if self.url else None)


def parse_server(spec: Any) -> ServerSpec:
    """A :class:`ServerSpec` from the ``server`` option; ValueError saying what is wrong otherwise."""
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ValueError("server is empty: give a command (python my_server.py), a URL or a mapping")
        if text.startswith(("http://", "https://")):
            return ServerSpec(url=_url(text))
        return ServerSpec(command=tuple(shlex.split(text)))
    if isinstance(spec, (list, tuple)):
        return ServerSpec(command=_command(spec))
    if not isinstance(spec, dict):
        raise ValueError(f"server must be a command, a URL or a mapping with command/url, got {spec!r}")
    unknown = sorted(set(spec) - set(SERVER_KEYS))
    if unknown:
        raise ValueError(f"server has unknown key(s) {', '.join(unknown)}; its keys are: {', '.join(SERVER_KEYS)}")
    command = spec.get("command")
    url = spec.get("url")
    if command is None and url is None:
        raise ValueError("server needs a command (a stdio server, or one that serves url) or a url")
    parts = _command(shlex.split(command) if isinstance(command, str) else command) if command is not None else ()
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"server.args must be a list of strings, got {args!r}")
    if args and not parts:
        raise ValueError("server.args needs server.command")
    env = spec.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"server.env must map names to strings, got {env!r}")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"server.cwd must be a folder, got {cwd!r}")
    command_parts: tuple[str, ...] = (*parts, *args)
    env = dict(env)
    venv = spec.get("venv")
    if venv is not None:
        if not parts:
            raise ValueError("server.venv needs server.command (the command to run in that environment)")
        command_parts, env = _in_venv(venv, command_parts, env)
    return ServerSpec(command=command_parts, url=_url(url) if url is not None else None, env=env, cwd=cwd)


def _in_venv(venv: Any, command: tuple[str, ...], env: dict[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The command and environment of a server run in the virtual environment ``venv`` (a folder, or an
    interpreter in its ``bin``)."""
    if not isinstance(venv, str) or not venv:
        raise ValueError(f"server.venv must be the folder of a virtual environment, got {venv!r}")
    root = os.path.expanduser(venv)
    if os.path.isfile(root):  # an interpreter: its environment is two folders up
        root = os.path.dirname(os.path.dirname(os.path.abspath(root)))
    root = os.path.abspath(root)
    bin_dir = os.path.join(root, "Scripts" if os.name == "nt" else "bin")
    if not os.path.isdir(bin_dir):
        raise ValueError(f"server.venv: {venv!r} is not a virtual environment (it has no {os.path.basename(bin_dir)} "
                         "folder); make one with python -m venv (or uv venv) and install the server there")
    first = command[0] if os.path.isabs(command[0]) else shutil.which(command[0], path=bin_dir) or command[0]
    path = os.pathsep.join(p for p in (bin_dir, env.get("PATH") or os.environ.get("PATH", "")) if p)
    return (first, *command[1:]), {**env, "VIRTUAL_ENV": root, "PATH": path}


def _command(parts: Any) -> tuple[str, ...]:
    if not isinstance(parts, (list, tuple)) or not parts or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"server command must be a non-empty list of strings (or one string), got {parts!r}")
    return tuple(parts)


def _url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"server.url must be an http:// or https:// URL, got {url!r}")
    return url


def free_port() -> int:
    """A loopback port nothing listens on now (the server binds it right after; a race is unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stderr_tail(log: IO[str] | None, limit: int = 400) -> str:
    """The last line(s) a server wrote to stderr, on one line (``""`` when none)."""
    if log is None:
        return ""
    try:
        log.flush()
        log.seek(0)
        text = log.read()
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-3:])
    return tail if len(tail) <= limit else "..." + tail[-limit:]


def new_log() -> IO[str]:
    """A temporary file for a server's stderr (deleted when closed)."""
    return tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")


class ServerProcessError(Exception):
    """A server process started with the run failed before serving; the message says how."""


class HttpServerProcess:
    """A streamable-HTTP server command started with the run, in its own process group."""

    def __init__(self, spec: ServerSpec, log: IO[str]):
        self.spec = spec
        self.log = log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, deadline: float) -> None:
        """Start the command and wait (until ``deadline``, a ``time.monotonic()`` value) for its port to listen."""
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.spec.command, stdin=asyncio.subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                env={**os.environ, **self.spec.env}, cwd=self.spec.cwd, start_new_session=True)
        except OSError as exc:
            raise ServerProcessError(f"could not start it: {exc.strerror or exc}") from None
        url = urlsplit(self.spec.url or "")
        host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
        while True:
            if self.process.returncode is not None:
                raise ServerProcessError(
                    f"it exited with code {self.process.returncode} before serving {self.spec.url}")
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
            except (OSError, asyncio.TimeoutError):
                if time.monotonic() >= deadline:
                    raise ServerProcessError(f"nothing listened on {host}:{port} in time") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return

    async def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace`` seconds; waits for the exit. Safe twice."""
        process = self.process
        if process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.returncode is not None:
                break
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                await asyncio.wait_for(process.wait(), timeout=grace)
            except asyncio.TimeoutError:
                continue
        try:  # the group's other members (a server's workers) go too
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process = None
