"""Where a rubric runs the model's code: scaffold's jail, the runtime verifiers' scoring is given by default.

A verifiers reward or metric function that asks for a ``runtime`` (``async def evaluate(self, trace, runtime)``)
runs programs in it: a code-golf rubric writes the model's program with ``runtime.write("solution.py", ...)``
and runs it with ``runtime.run(["python3", "solution.py"], {})``. In the library that runtime is the agent's
(a container, or for the ``subprocess`` runtime this machine, as the scaffold user). Here the scoring gets a
:class:`JailRuntime` instead (``task.code_execution: jail``, the default): files written to it are kept in
memory, and a Python program run in it runs in the python tool's jail (``scaffold_tools.run_untrusted``:
bubblewrap, a system-call filter, no network, an unprivileged user, resource limits), with those files in its
working directory. ``task.code_execution: host`` gives the scoring the agent's own runtime, as the library does,
and says so loudly.

What the jail runtime runs: ``python``/``python3`` with a file written before (flags such as ``-u`` allowed,
arguments passed as ``sys.argv``), ``python -c CODE``, and ``true`` (the library's liveness probe). Anything
else (a shell, another binary) raises the library's ``SandboxError`` naming the command, so the scoring fails
loudly rather than scoring 0. ``read`` returns files written to it (and those the agent's runtime held when
scoring began), never files the program made: each program's working directory is gone when it ends.
"""

from __future__ import annotations

import base64
import os
import posixpath
import sys
from pathlib import Path
from typing import Any

#: Limits of one program the scoring runs (seconds, MiB, bytes of output kept).
PROGRAM_TIMEOUT = 10.0
PROGRAM_MEMORY_MB = 512
PROGRAM_OUTPUT_BYTES = 1 << 20
#: Files of the agent's runtime copied into the jail runtime when scoring begins (bounded).
SEED_FILE_BYTES = 1 << 20
SEED_TOTAL_BYTES = 8 << 20
SEED_FILES = 200
INTERPRETERS = ("python", "python3", f"python3.{sys.version_info.minor}")
#: Interpreter flags a program may be run with (they change nothing a jailed program could use).
FLAGS = ("-u", "-B", "-I", "-E", "-S", "-s", "-O", "-OO", "-q")

LAUNCHER = '''\
import base64 as _b, os as _o, sys as _s
_files = {files!r}
for _name, _data in _files.items():
    _dir = _o.path.dirname(_name)
    if _dir:
        _o.makedirs(_dir, exist_ok=True)
    with open(_name, "wb") as _f:
        _f.write(_b.b64decode(_data))
_s.argv = {argv!r}
_source = {source!r}
_globals = {{"__name__": "__main__", "__file__": _s.argv[0], "__builtins__": __builtins__}}
del _b, _o, _s, _files, _name, _data, _dir, _f
exec(compile(_source, {filename!r}, "exec"), _globals)
'''

_CLASS: Any = None


def _relative(path: str) -> str:
    """A path inside the program's working directory (absolute paths are taken relative to its root)."""
    normal = posixpath.normpath(path.lstrip("/"))
    if normal.startswith("..") or normal in ("", "."):
        raise ValueError(f"path {path!r} is outside the runtime's working directory")
    return normal


def jail_runtime_class() -> Any:  # noqa: C901 - one class, defined once verifiers is importable
    """The :class:`JailRuntime` class (a ``verifiers.v1`` ``Runtime``; built on first use, verifiers is optional)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from types import SimpleNamespace

    from verifiers.v1.errors import SandboxError
    from verifiers.v1.runtimes.base import ProgramResult, Runtime

    class JailRuntime(Runtime):
        """A runtime for scoring whose Python programs run in scaffold's jail (see the module docstring)."""

        def __init__(self, files: dict[str, bytes] | None = None) -> None:
            super().__init__("scaffold-jail")
            self.config = SimpleNamespace(type="scaffold_jail")
            self.files: dict[str, bytes] = dict(files or {})
            #: The programs run, for the record: (argv, exit code, status).
            self.ran: list[tuple[list[str], int, str]] = []

        async def start(self) -> None:
            return None

        async def write(self, path: str, data: bytes) -> None:
            self.files[_relative(path)] = bytes(data)

        async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
            try:
                data = self.files[_relative(path)]
            except (KeyError, ValueError):
                raise SandboxError(f"read {path!r}: no such file in scaffold's jail runtime (it holds the files "
                                   "written to it; a program's own files are gone when it ends)") from None
            return data if max_bytes is None else data[:max_bytes]

        async def run(self, argv: list[str], env: dict[str, str]) -> Any:
            program = self._program(list(argv))
            if program is None:
                return ProgramResult(exit_code=0, stdout="", stderr="")
            from scaffold_tools import run_untrusted

            result = await run_untrusted(program, timeout=PROGRAM_TIMEOUT, memory_mb=PROGRAM_MEMORY_MB,
                                         max_output_bytes=PROGRAM_OUTPUT_BYTES, cpu_seconds=int(PROGRAM_TIMEOUT))
            if result.status == "setup":
                raise SandboxError(f"scaffold's jail could not start {argv[:3]!r}: {result.stderr.strip()[-300:]}")
            code = result.exit_code if result.exit_code is not None else 137
            self.ran.append((list(argv), code, result.status))
            notes = {"timeout": "[stopped: past the time limit]", "cpu": "[stopped: past the CPU-time limit]",
                     "memory": "[stopped: past the memory limit]", "output": "[stopped: too much output]",
                     "forbidden": "[stopped: a forbidden system call]"}
            stderr = result.stderr + (("\n" + notes[result.status]) if result.status in notes else "")
            return ProgramResult(exit_code=code if code else (0 if result.ok else 1), stdout=result.stdout,
                                 stderr=stderr)

        def _program(self, argv: list[str]) -> str | None:
            """The launcher program for ``argv`` (None for ``true``); SandboxError for what it cannot run."""
            if argv == ["true"]:
                return None
            if not argv or os.path.basename(argv[0]) not in INTERPRETERS:
                raise SandboxError(f"scaffold's jail runtime runs Python programs only (python FILE or python -c "
                                   f"CODE), not {' '.join(argv)[:120]!r}; set task.code_execution: host to run "
                                   "the rubric's commands on this machine")
            rest = argv[1:]
            while rest and rest[0] in FLAGS:
                rest = rest[1:]
            if rest[:1] == ["-c"] and len(rest) >= 2:
                source, filename, args = rest[1], "<string>", ["-c", *rest[2:]]
            elif rest and not rest[0].startswith("-"):
                name = _relative(rest[0])
                if name not in self.files:
                    raise SandboxError(f"scaffold's jail runtime: {rest[0]!r} was not written before it was run")
                source, filename, args = self.files[name].decode("utf-8", "replace"), name, [name, *rest[1:]]
            else:
                raise SandboxError(f"scaffold's jail runtime cannot run {' '.join(argv)[:120]!r}: give a file "
                                   "written to the runtime, or -c CODE")
            files = {name: base64.b64encode(data).decode() for name, data in self.files.items()}
            return LAUNCHER.format(files=files, argv=args, source=source, filename=filename)

    _CLASS = JailRuntime
    return JailRuntime


def seed_files(runtime: Any) -> dict[str, bytes]:
    """The small regular files of a local runtime's working directory (the agent's), bounded in number and size."""
    folder = getattr(runtime, "workdir", None)
    files: dict[str, bytes] = {}
    if not isinstance(folder, Path) or not folder.is_dir():
        return files
    total = 0
    for path in sorted(folder.rglob("*")):
        if len(files) >= SEED_FILES or not path.is_file() or path.is_symlink():
            continue
        size = path.stat().st_size
        if size > SEED_FILE_BYTES or total + size > SEED_TOTAL_BYTES:
            continue
        files[str(path.relative_to(folder))] = path.read_bytes()
        total += size
    return files


def jailed_task_class(task_cls: type) -> type:
    """A subclass of a verifiers task class whose scoring runs in a :class:`JailRuntime` instead of the agent's
    runtime (seeded with the agent runtime's small files). Everything else is the task's own."""
    cached = getattr(task_cls, "_scaffold_jailed", None)
    if cached is not None and cached.__bases__ == (task_cls,):
        return cached

    class Jailed(task_cls):
        async def score(self, trace: Any, runtime: Any = None) -> None:
            jail = None if runtime is None else jail_runtime_class()(seed_files(runtime))
            await super().score(trace, jail)

    Jailed.__name__ = Jailed.__qualname__ = task_cls.__name__
    Jailed.__module__ = task_cls.__module__
    task_cls._scaffold_jailed = Jailed  # type: ignore[attr-defined]
    return Jailed


HOST_WARNING = (
    "WARNING: task.code_execution: host. The verifiers environment's rubric runs the model's code on this machine, "
    "as this user, with nothing between it and your files, keys and network. Use it only for code you trust; "
    "remove code_execution: host to run it in scaffold's jail.")
_warned: set[str] = set()


def warn_host_execution(env_id: str) -> None:
    """The loud warning of ``code_execution: host`` (once per environment and process)."""
    if env_id in _warned:
        return
    _warned.add(env_id)
    import logging

    bar = "!" * 78
    print(f"\n{bar}\n{HOST_WARNING} (environment {env_id!r})\n{bar}", file=sys.stderr)
    logging.getLogger("scaffold.verifiers").warning("code_execution: host for verifiers environment %r", env_id)
