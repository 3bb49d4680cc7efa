"""A run's derived files written on a core of their own, by a process that follows its ledger.

On a machine with a core to spare, a run leaves its :class:`.live.LivePart` (samples and failure lines,
dataset rows, written as the run goes) to a child process (:func:`main`, in a fresh interpreter):
the run only packs and writes its ledger, and after each write it tells the child how far the ledger's
whole lines now reach (a number on the child's input). The child reads the new lines back (they were just
written: the page cache has them) with their blobs, parses them as deriving the files from the ledger
does, and adds them to its part. So the part holds exactly what the ledger holds, and the work of the
derived files runs beside the run instead of on its event loop.

The child lives as long as its input: it runs in a session of its own, so the signals a run's process
group gets (a terminal's Ctrl-C) are the run's to handle (it stops gracefully, then finishes the part),
and when its input closes without a finish (the run gave the part up, or died) it removes its part and
exits. Nothing that goes wrong in the child (it fails, dies, or does not answer in time) loses anything:
the run's files are then derived from the ledger at its end, as for a resumed run.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..distributed.env import usable_cores
from .files import open_nofollow
from .ledger import parse_record
from .live import LivePart
from .tokens import TokenFile, is_packed, tokens_path

#: How long finishing the part may take, from the run's last write (the child is normally caught up
#: within milliseconds); past it the child is stopped and the files are derived from the ledger.
FINISH_TIMEOUT_S = 300.0
#: How long a child that was told to stop may take to exit before it is killed.
EXIT_TIMEOUT_S = 10.0
#: Ledger bytes read back at a time.
READ_BYTES = 1 << 22


#: The child's program (not ``-m``: the package imports this module before ``-m`` would run it again).
_CHILD = f"import sys; from {__name__} import main; sys.exit(main())"


def spare_cores(processes: int = 1) -> bool:
    """Whether this machine gives each of ``processes`` run processes on it a second core (for its follower)."""
    return usable_cores() >= 2 * max(1, processes)


class LedgerFollower:
    """The run's side of a follower: starts the child, tells it about writes, collects its part."""

    def __init__(self, directory: Path, ledger: Path, save_dataset: bool, *, start: int = 0, private: bool = True,
                 first: int = 0, step: int = 1):
        """``start``: where in the ledger this session's lines begin; the rest as :class:`.live.LivePart`."""
        self.folder: Path | None = None  # the part's folder, once the child said it
        self._told = start
        root = str(Path(__file__).resolve().parents[2])  # where this package comes from: first in the child's path
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self._proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env,
            start_new_session=True)  # a signal to the run's process group (Ctrl-C) is the run's to handle
        self._send(json.dumps({"directory": str(directory), "ledger": str(ledger), "start": start,
                               "save_dataset": save_dataset, "private": private, "first": first, "step": step}))

    def _send(self, line: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        data = (line + "\n").encode("utf-8")
        fd = self._proc.stdin.fileno()
        while data:  # a full pipe (the child behind) holds the run back until it catches up
            data = data[os.write(fd, data):]

    def wrote(self, end: int) -> None:
        """The ledger's whole lines now reach byte ``end``. OSError when the child is gone."""
        if end > self._told:
            self._send(str(end))
            self._told = end

    def finish(self, *, end: int, metrics: dict[str, Any] | None, timeout: float | None = None) -> Path:
        """Have the child add the records up to ``end`` and complete its part (see :meth:`.live.LivePart.finish`);
        the part's folder. RuntimeError (or OSError) when it cannot: the caller derives the files from the
        ledger."""
        timeout = FINISH_TIMEOUT_S if timeout is None else timeout
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        self._send(json.dumps({"end": end, "metrics": metrics}))
        assert proc.stdin is not None
        proc.stdin.close()
        replies = self._end(timeout)
        done = next((r for r in replies if "done" in r), None)
        if done is None:
            raise RuntimeError(f"the process writing them stopped (exit status {proc.returncode})" if replies.ended
                               else f"the process writing them did not finish its part within {timeout:g} s")
        if done["done"] is None:
            raise RuntimeError(done.get("error") or "the process writing them gave its part up")
        return Path(done["done"])

    def abort(self) -> None:
        """Stop the child and drop its part."""
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()  # the child removes its part and exits
            except OSError:
                pass
        self._end(EXIT_TIMEOUT_S)
        if self.folder is not None:  # a child killed before it removed its part
            shutil.rmtree(self.folder, ignore_errors=True)

    def _end(self, timeout: float) -> _Replies:
        """The child's replies until it closes its output (within ``timeout``), then the child gone: one that
        did not close it in time is killed."""
        proc, self._proc = self._proc, None
        if proc is None:
            return _Replies()
        replies = _read_lines(proc.stdout, time.monotonic() + timeout)
        try:
            proc.wait(timeout=EXIT_TIMEOUT_S if replies.ended else 0.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
        for reply in replies:
            if "folder" in reply:
                self.folder = Path(reply["folder"])
        return replies


class _Replies(list[dict[str, Any]]):
    """A child's replies (JSON objects), and whether it closed its output (it is exiting)."""

    ended = True


def _read_lines(pipe: IO[bytes] | None, deadline: float) -> _Replies:
    """The JSON lines a child writes until it closes its output or the deadline passes."""
    out = _Replies()
    if pipe is None:
        return out
    fd = pipe.fileno()
    data = b""
    out.ended = False
    while not out.ended:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        out.ended = not chunk
        data += chunk
    for line in data.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


# -- the child --------------------------------------------------------------------------------------
class _Reader:
    """Whole ledger lines read back from where the last read stopped, with their blobs."""

    def __init__(self, ledger: Path, start: int):
        self.fd = open_nofollow(ledger, os.O_RDONLY)
        self.tokens = TokenFile(tokens_path(ledger))
        self.at = start

    def records(self, end: int) -> Iterator[tuple[dict[str, Any], bytes]]:
        """The records (and blobs) of the lines from where the last call stopped up to byte ``end``."""
        while self.at < end:
            data = os.pread(self.fd, min(READ_BYTES, end - self.at), self.at)
            if not data:
                raise RuntimeError(f"the ledger ends at byte {self.at}, before {end}")
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a read: read it whole
                data = os.pread(self.fd, end - self.at, self.at)
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    raise RuntimeError(f"the ledger has no whole line between bytes {self.at} and {end}")
            self.at += cut
            for raw in data[:cut].splitlines(keepends=True):
                record = parse_record(raw)
                if record is None:
                    raise RuntimeError("a ledger line the run wrote is not a record")
                blob = b""
                if is_packed(record):
                    blob = self.tokens.blob(record)
                yield record, blob

    def close(self) -> None:
        os.close(self.fd)
        self.tokens.close()


def _say(value: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(value).encode("utf-8") + b"\n")
    sys.stdout.buffer.flush()


def main() -> int:
    """The child: read the plan, then follow the ledger as the run's messages say (see the module's doc)."""
    stdin = sys.stdin.buffer
    plan = json.loads(stdin.readline())
    part = LivePart(Path(plan["directory"]), plan["save_dataset"], private=plan["private"], first=plan["first"],
                    step=plan["step"])
    _say({"folder": str(part.folder)})
    reader = _Reader(Path(plan["ledger"]), plan["start"])
    finished = False
    try:
        error = None
        for line in stdin:
            message: dict[str, Any] = json.loads(line) if line.startswith(b"{") else {"end": int(line)}
            if error is None:
                try:
                    for record, blob in reader.records(message["end"]):
                        part.add(record, blob)
                    if "metrics" in message:
                        folder = part.finish(ledger=Path(plan["ledger"]).name, start=plan["start"],
                                             end=message["end"], metrics=message["metrics"])
                        finished = True
                        _say({"done": str(folder)})
                        return 0
                except Exception as exc:  # the part is given up; the run learns why when it finishes
                    error = f"{type(exc).__name__}: {exc}"
                    part.abort()
            if "metrics" in message:
                _say({"done": None, "error": error})
                return 0
        return 0  # the input closed without a finish: the run gave the part up
    finally:
        reader.close()
        if not finished:
            part.abort()
