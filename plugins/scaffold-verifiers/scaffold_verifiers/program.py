"""The library's chat program (the ``null`` harness's agent loop) on the interpreter scaffold runs on.

The ``null`` harness runs its agent loop as a standalone PEP 723 script (``openai``, ``mcp``, ``httpx``...),
which the library's subprocess runtime prepares with ``uv sync --script``: a fresh virtual environment,
downloaded from a package index, per machine. The running interpreter already has every one of those
packages (they are verifiers' own dependencies), so scaffold writes the very same script where the runtime
looks for it and records this interpreter as the one that runs it, in the runtime's own cache of prepared
scripts. The program is the library's, byte for byte; only where its packages come from differs. If this
interpreter lacks a package the script declares, nothing is recorded and the error says which.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import sys
import tempfile
import threading
from pathlib import Path

from scaffold_core.errors import MissingDependencyError

_LOCK = threading.Lock()
_PREPARED: set[str] = set()


def declared_dependencies(script: str) -> list[str]:
    """The ``dependencies`` of a PEP 723 script's metadata block."""
    block = re.search(r"^# /// script\n((?:#.*\n)*?)# ///", script, re.M)
    if block is None:
        return []
    body = "\n".join(line[2:] if line.startswith("# ") else line[1:] for line in block.group(1).splitlines())
    found = re.search(r"dependencies\s*=\s*\[(.*?)\]", body, re.S)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def missing_dependencies(requirements: list[str]) -> list[str]:
    """The requirements this interpreter does not satisfy."""
    from packaging.requirements import Requirement

    missing = []
    for text in requirements:
        requirement = Requirement(text)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (installed: {version})")
    return missing


def run_chat_program_here() -> None:
    """Make the library's subprocess runtime run the chat program with this interpreter (see the module docstring);
    once per process. MissingDependencyError naming the packages when this interpreter lacks one."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = f"{SubprocessRuntime.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
    with _LOCK:
        if path in _PREPARED:
            return
        missing = missing_dependencies(declared_dependencies(CHAT_PROGRAM_SOURCE))
        if missing:
            raise MissingDependencyError(f"the verifiers chat program (the null harness's agent loop) needs "
                                         f"{', '.join(missing)} in this environment: pip install "
                                         f"{' '.join(repr(m.split(' ')[0]) for m in missing)}")
        cache = getattr(SubprocessRuntime, "_interpreters", None)
        if not isinstance(cache, dict):  # another verifiers release: leave the library's own uv preparation
            _PREPARED.add(path)
            return
        _write_once(Path(path), data)
        cache.setdefault(path, sys.executable)
        _PREPARED.add(path)


def _write_once(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
