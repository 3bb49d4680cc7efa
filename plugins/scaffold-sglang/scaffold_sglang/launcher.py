"""Start and stop SGLang server processes (``engine.launch``).

Each server is ``sys.executable -m sglang.launch_server`` (or a configured
command prefix) started from an argument list, never a shell string, in its
own process group, with its output written to ``<output dir>/sglang/``.
Ports come from this worker's own port slice (reserved by binding, released
right before the server starts), so two workers launching at once never
collide. Readiness is ``/health_generate`` (configurable) answering 200,
while the process is alive, within ``setup_timeout``; the error of a server
that exits or never becomes ready carries the tail of its log. Every server
is stopped (SIGTERM to the whole group, SIGKILL after ``stop_timeout``) on
close, on a failed start and on Ctrl-C; on Linux a server also receives
SIGTERM if the process that launched it dies.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scaffold_core.distributed.net import format_url, loopback_host, strip_brackets
from scaffold_core.errors import ScaffoldError, require_module
from scaffold_core.output.redact import Redactor, copy_redacted, secret_values

log = logging.getLogger("scaffold.sglang")

DEFAULT_COMMAND = ("-m", "sglang.launch_server")  # after sys.executable
#: Flags scaffold sets itself; giving them in extra_args is an error that says what to use instead.
MANAGED_FLAGS = {
    "--model-path": "engine.launch.model_path", "--model": "engine.launch.model_path",
    "--host": "engine.launch.host", "--port": "the worker's port range (ports are assigned)",
    "--nccl-port": "the worker's port range (ports are assigned)",
    "--tp-size": "engine.launch.tp", "--tp": "engine.launch.tp", "--tensor-parallel-size": "engine.launch.tp",
    "--api-key": "engine.launch.use_api_key with the key in the engine.api_key_env variable",
}
BIND_ERRORS = ("address already in use", "errno 98", "eaddrinuse", "could not bind")
LOG_TAIL_LINES = 40


class LaunchError(ScaffoldError):
    """SGLang servers could not be started (the message carries the server's log tail)."""


class LaunchOptions(BaseModel):
    """``engine.launch``: which servers to start and how."""

    model_config = ConfigDict(extra="forbid", validate_default=True)
    model_path: str = Field(description="model directory or hub id passed to --model-path")
    count: int = Field(1, ge=1, description="servers this worker starts")
    tp: int = Field(1, ge=1, description="tensor-parallel GPUs per server (--tp-size)")
    host: str | None = Field(None, description="address the servers bind (IPv6 raw, e.g. ::1); default: "
                                                "the IPv4 loopback, or ::1 on an IPv6-only host")
    extra_args: list[str] = Field(default_factory=list, description="more sglang.launch_server arguments")
    command: list[str] | None = Field(None, description="command prefix; default: python -m sglang.launch_server")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the servers")
    assign_gpus: bool = Field(True, description="pass --base-gpu-id so servers of one host use distinct GPUs")
    use_api_key: bool = Field(False, description="start servers with --api-key from engine.api_key_env")
    stop_timeout: float = Field(30.0, gt=0, description="seconds between SIGTERM and SIGKILL")
    log_dir: str | None = Field(None, description="where server logs go; default <output dir>/sglang")

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                raise ValueError(f"{flag} is set by scaffold; use {MANAGED_FLAGS[flag]} instead")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(isinstance(a, str) and a for a in value)):
            raise ValueError("must be a non-empty list of arguments, e.g. [python, -m, sglang.launch_server]")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str:
        return loopback_host() if value is None else strip_brackets(value)  # raw; bracketed only in URLs


def parse_launch_options(data: Any) -> LaunchOptions:
    """Validate ``engine.launch``; errors name the key, the value and what is allowed."""
    if isinstance(data, LaunchOptions):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"engine.launch must be a mapping such as {{model_path: ..., count: 1}}, got {data!r}")
    from pydantic import ValidationError

    try:
        return LaunchOptions(**data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            key = loc.split(".")[0]
            if err.get("type") == "extra_forbidden":
                lines.append(f"engine.launch.{loc}: unknown key; allowed: {', '.join(LaunchOptions.model_fields)}")
            elif err.get("type") == "missing":
                lines.append(f"engine.launch.{loc}: required")
            else:
                msg = str(err.get("msg", "")).removeprefix("Value error, ")
                field_info = LaunchOptions.model_fields.get(key)
                allowed = f" ({field_info.description})" if field_info and field_info.description else ""
                lines.append(f"engine.launch.{loc}: {msg}; got {err.get('input')!r}{allowed}")
        raise ValueError("\n".join(lines)) from None


# ---------------------------------------------------------------------------
# One server process
# ---------------------------------------------------------------------------


@dataclass(eq=False)
class ServerProcess:
    """A launched server: its address, process (group leader) and log file."""

    index: int
    host: str
    port: int
    nccl_port: int
    argv: list[str]
    log_path: Path
    display: str = ""
    proc: subprocess.Popen | None = None
    launches: int = 0
    last_probe: str = "not probed yet"
    #: Extra strings hidden in the log (the API key the server was started with).
    secrets: tuple[str, ...] = ()
    _copier: threading.Thread | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return format_url("http", self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"(could not read {self.log_path}: {exc})"
        tail = text.splitlines()[-lines:]
        return "\n".join("    " + line for line in tail) if tail else "    (the log is empty)"

    def start(self, env: dict[str, str]) -> None:
        """Start the server; its output reaches the log (0600, never through a link) with secrets as ``***``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise LaunchError(f"cannot open the server log {self.log_path} ({exc}); if it is a symbolic link, "
                              "remove it: logs are never written through links") from exc
        os.write(fd, f"# scaffold: starting server {self.index}: {self.display}\n".encode())
        self.launches += 1
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
        except OSError as exc:
            os.close(fd)
            raise LaunchError(f"cannot start sglang server {self.index} ({self.display}): {exc}") from exc
        redactor = Redactor([*secret_values(env), *self.secrets])
        self._copier = threading.Thread(target=copy_redacted, args=(self.proc.stdout, fd, redactor), daemon=True,
                                        name=f"scaffold-sglang-log-{self.index}")
        self._copier.start()
        _LIVE.add(self)

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self) -> None:
        """After the leader exited: kill what is left of its group, reap, close the log."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process immune to SIGKILL
                log.error("sglang server pid %s did not exit after SIGKILL", self.proc.pid)
        if self._copier is not None:  # the pipe ends with the process group: the copier drains it and stops
            self._copier.join(timeout=10)
            self._copier = None
        _LIVE.discard(self)

    def stop(self, timeout: float) -> None:
        """Blocking stop: SIGTERM the group, wait up to ``timeout``, then SIGKILL it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.finish()


# Linux: a server gets SIGTERM when the thread that launched it dies (even by SIGKILL).
_PRCTL: Any = None
if sys.platform.startswith("linux"):
    try:
        _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # pragma: no cover - unusual libc
        _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


#: Every server started by this process and not yet stopped (stopped at interpreter exit).
_LIVE: set[ServerProcess] = set()


def live_servers() -> list[ServerProcess]:
    """Servers this process launched that are not stopped yet (tests check it is empty)."""
    return list(_LIVE)


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.stop(timeout=5.0)


# ---------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------


class Launcher:
    """Starts ``options.count`` servers for one worker and stops them all."""

    def __init__(self, options: LaunchOptions, *, port_range: tuple[int, int], log_dir: Path, rank: int = 0,
                 local_rank: int = 0, api_key: str | None = None):
        self.options = options
        self.port_range = port_range
        self.log_dir = log_dir
        self.rank = rank
        self.local_rank = local_rank
        self.api_key = api_key
        self.servers: list[ServerProcess] = []
        self._used_ports: set[int] = set()

    # -- commands -----------------------------------------------------------
    def command_prefix(self) -> list[str]:
        if self.options.command is not None:
            return list(self.options.command)
        require_module("sglang", needed_by=f"engine.launch (it starts SGLang servers with {sys.executable})",
                       load=False, install='pip install "scaffold-sglang[server]" (on a GPU machine), or start the '
                                           "servers yourself and set engine.url instead")
        return [sys.executable, *DEFAULT_COMMAND]

    def argv(self, index: int, port: int, nccl_port: int) -> tuple[list[str], str]:
        """(argument list, the same for display with the API key redacted)."""
        o = self.options
        args = [*self.command_prefix(), "--model-path", o.model_path, "--host", o.host or loopback_host(),
                "--port", str(port), "--nccl-port", str(nccl_port), "--tp-size", str(o.tp)]
        if o.assign_gpus and not any(a.split("=", 1)[0] == "--base-gpu-id" for a in o.extra_args):
            args += ["--base-gpu-id", str((self.local_rank * o.count + index) * o.tp)]
        secret = None
        if o.use_api_key:
            if not self.api_key:
                raise LaunchError("engine.launch.use_api_key is set but no API key is in the environment variable "
                                  "named by engine.api_key_env (default SGLANG_API_KEY)")
            secret = self.api_key
            args += ["--api-key", secret]
        args += list(o.extra_args)
        shown = [("***" if secret is not None and a == secret else a) for a in args]
        return args, shlex.join(shown)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.options.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _reserve(self, count: int) -> list[Any]:
        from scaffold_core.distributed.ports import reserve_ports

        try:
            return reserve_ports(count, rank=0, world_size=1, host="", port_range=self.port_range,
                                 exclude=self._used_ports)
        except OSError as exc:
            raise LaunchError(f"cannot reserve {count} port(s) for SGLang servers in this worker's range "
                              f"{self.port_range[0]}-{self.port_range[1]}: {exc}") from None

    # -- starting -------------------------------------------------------------
    def start(self) -> list[ServerProcess]:
        """Reserve ports and start every server (returns at once; then ``await wait_ready``)."""
        o = self.options
        prefix_check = self.command_prefix()  # fail before reserving anything when sglang is missing
        del prefix_check
        reservations = self._reserve(2 * o.count)
        try:
            env = self._env()
            for i in range(o.count):
                http, nccl = reservations[2 * i], reservations[2 * i + 1]
                self._used_ports.update((http.port, nccl.port))
                argv, display = self.argv(i, http.port, nccl.port)
                server = ServerProcess(i, o.host or loopback_host(), http.port, nccl.port, argv,
                                       self.log_dir / f"server-r{self.rank}-{i}.log", display,
                                       secrets=(self.api_key,) if self.api_key else ())
                self.servers.append(server)
                http.release()
                nccl.release()
                server.start(env)
                log.info("started sglang server %d (pid %s) at %s; log %s", i, server.pid, server.url,
                         server.log_path)
        except BaseException:
            for r in reservations:
                r.release()
            self.stop_now()
            raise
        return self.servers

    def _relaunch(self, server: ServerProcess) -> None:
        """Start ``server`` again on fresh ports (its ports were taken by someone else)."""
        server.finish()
        http, nccl = self._reserve(2)
        self._used_ports.update((http.port, nccl.port))
        server.port, server.nccl_port = http.port, nccl.port
        server.argv, server.display = self.argv(server.index, http.port, nccl.port)
        http.release()
        nccl.release()
        server.start(self._env())
        log.warning("sglang server %d lost its port to another process; restarted on port %d", server.index,
                    server.port)

    async def wait_ready(self, probe: Callable[[str, str, float], Awaitable[str | None]], timeout: float,  # noqa: C901
                         path: str = "/health_generate") -> None:
        """Poll every server's health endpoint until all answer 200; raise LaunchError with the log tail.

        Probes run concurrently with watching the processes, so a server that
        exits is reported at once, whatever its probe is doing.
        """
        started = time.monotonic()
        deadline = started + timeout
        pending = list(self.servers)
        probes: dict[ServerProcess, asyncio.Future] = {}
        next_probe = {s: started for s in pending}
        interval = {s: 0.1 for s in pending}
        next_note = started + 30.0
        try:
            while True:
                now = time.monotonic()
                for server in list(pending):
                    code = server.exit_code()
                    if code is None:
                        continue
                    if server in probes:
                        probes.pop(server).cancel()
                    tail = server.log_tail()
                    if server.launches < 3 and any(e in tail.lower() for e in BIND_ERRORS):
                        self._relaunch(server)
                        continue
                    raise LaunchError(
                        f"sglang server {server.index} ({server.url}) exited with code {code} before it was "
                        f"ready. Command: {server.display}\nLast lines of {server.log_path}:\n{tail}")
                for server, task in list(probes.items()):
                    if not task.done():
                        continue
                    del probes[server]
                    why = task.result()
                    if why is None and server.exit_code() is None:
                        pending.remove(server)
                        log.info("sglang server %d at %s is ready (%.1f s)", server.index, server.url,
                                 now - started)
                    elif why is not None:
                        server.last_probe = why
                        next_probe[server] = now + interval[server]
                        interval[server] = min(interval[server] * 1.5, 2.0)
                if not pending:
                    return
                if now >= deadline:
                    first = pending[0]
                    raise LaunchError(
                        f"{len(pending)} sglang server(s) not ready within setup_timeout={timeout:g} s: "
                        + ", ".join(f"{s.url} ({s.last_probe})" for s in pending)
                        + f". Command: {first.display}\nLast lines of {first.log_path}:\n{first.log_tail()}")
                for server in pending:
                    if server not in probes and now >= next_probe[server]:
                        probe_timeout = max(0.1, min(10.0, deadline - now))
                        probes[server] = asyncio.ensure_future(probe(server.url, path, probe_timeout))
                if now >= next_note:
                    next_note += 30.0
                    log.warning("still waiting for %d sglang server(s) after %.0f s (setup_timeout %g s): %s",
                                len(pending), now - started, timeout,
                                ", ".join(f"{s.url}: {s.last_probe}" for s in pending))
                await asyncio.sleep(max(0.0, min(0.05, deadline - now)))
        finally:
            for task in probes.values():
                task.cancel()

    # -- stopping -------------------------------------------------------------
    def stop_now(self, timeout: float | None = None) -> None:
        """Blocking stop of every server (SIGTERM all groups, wait, SIGKILL what is left)."""
        timeout = self.options.stop_timeout if timeout is None else timeout
        for server in self.servers:
            if server.exit_code() is None:
                server.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if server.proc is not None and server.exit_code() is None:
                try:
                    server.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            server.finish()

    async def stop(self, timeout: float | None = None) -> None:
        """Like :meth:`stop_now`, waiting without blocking the event loop."""
        timeout = self.options.stop_timeout if timeout is None else timeout
        for server in self.servers:
            if server.exit_code() is None:
                server.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(s.exit_code() is None for s in self.servers):
            await asyncio.sleep(0.05)
        for server in self.servers:
            server.finish()


def default_log_dir(output_dir: Path | None, configured: str | None) -> Path:
    """``launch.log_dir``, else ``<output dir>/sglang``, else a fresh temporary directory (kept)."""
    if configured:
        return Path(configured).expanduser()
    if output_dir is not None:
        return Path(output_dir) / "sglang"
    return Path(tempfile.mkdtemp(prefix="scaffold-sglang-logs-"))

