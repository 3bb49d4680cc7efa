"""Port-allocation stress check: N processes reserve ports at the same moment, then bind them for real.

``python -m scaffold_testkit.port_stress --workers 16 --ports 8 --rounds 50 [--no-ipv6] [--same-slice]``
prints JSON figures. Each round the parent tells every child "reserve" at
once; each child reserves ``--ports`` ports from its rank slice
(:func:`scaffold_core.distributed.ports.reserve_ports`) and reports them; then "bind":
each child releases its reservations and binds real listening sockets (with
``SO_REUSEADDR``, as servers do) on them, counting EADDRINUSE; then "close".
The parent counts ports handed to two processes in the same round
(collisions) and bind failures.

``--probe-only`` makes the children release each port as soon as they
found it free (probe-then-hope, the anchor system's bug) to show the check
catches collisions. ``--no-ipv6`` simulates a host without IPv6 in the children: creating an
AF_INET6 socket fails with EAFNOSUPPORT. ``--same-slice`` gives every child
the same slice (rank 0 of 1), so only binding keeps the reservations apart.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from typing import Any

# -- child --------------------------------------------------------------------


def disable_ipv6_sockets() -> None:
    """Make ``socket.socket(AF_INET6, ...)`` fail in this process, as on a kernel without IPv6."""
    real = socket.socket

    class NoIPv6Socket(real):  # type: ignore[misc, valid-type]
        def __init__(self, family: int = -1, *args: Any, **kwargs: Any):
            if family == socket.AF_INET6:
                raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
            super().__init__(family, *args, **kwargs)

    socket.socket = NoIPv6Socket  # type: ignore[misc]


def _real_bind(port: int, ipv6: bool) -> tuple[list[socket.socket], int]:
    held, in_use = [], 0
    targets = [(socket.AF_INET, "0.0.0.0")] + ([(socket.AF_INET6, "::")] if ipv6 else [])
    for family, host in targets:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s.bind((host, port))
            s.listen(8)
            held.append(s)
        except OSError as exc:
            s.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            in_use += 1
    return held, in_use


def child(rank: int, world: int, count: int, no_ipv6: bool, probe_only: bool = False) -> None:
    if no_ipv6:
        disable_ipv6_sockets()
    from scaffold_core.distributed.net import has_ipv6
    from scaffold_core.distributed.ports import reserve_ports

    ipv6 = has_ipv6()
    reservations: list[Any] = []
    servers: list[socket.socket] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "reserve":
            try:
                reservations = reserve_ports(count, rank=rank, world_size=world)
                if probe_only:
                    for r in reservations:
                        r.release()
                reply: dict[str, Any] = {"ports": [r.port for r in reservations]}
            except OSError as exc:
                reply = {"error": str(exc)}
        elif command == "bind":
            in_use = 0
            for r in reservations:
                held, busy = _real_bind(r.release(), ipv6)
                servers.extend(held)
                in_use += busy
            reply = {"eaddrinuse": in_use, "ipv6": ipv6}
        elif command == "close":
            for s in servers:
                s.close()
            servers, reservations = [], []
            reply = {"ok": True}
        else:
            break
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


# -- parent -------------------------------------------------------------------


def _ask(procs: list[subprocess.Popen], command: str, deadline: float) -> list[dict[str, Any]]:
    for p in procs:  # every child gets the command at (nearly) the same moment
        p.stdin.write(command + "\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    replies: dict[int, dict[str, Any]] = {}
    sel = selectors.DefaultSelector()
    for i, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, i)  # type: ignore[arg-type]
    try:
        while len(replies) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"children did not answer {command!r} in time "
                                   f"({len(replies)} of {len(procs)} did)")
            for key, _ in sel.select(timeout=left):
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(f"child {key.data} exited during {command!r}")
                replies[key.data] = json.loads(line)
                sel.unregister(key.fileobj)
    finally:
        sel.close()
    return [replies[i] for i in range(len(procs))]


def run(workers: int = 16, ports: int = 8, rounds: int = 50, *, no_ipv6: bool = False, same_slice: bool = False,
        probe_only: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the check; returns the figures (collisions, eaddrinuse, errors, rounds, seconds)."""
    deadline = time.monotonic() + timeout_s
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    figures: dict[str, Any] = {"workers": workers, "ports_per_worker": ports, "rounds": 0, "no_ipv6": no_ipv6,
                               "same_slice": same_slice, "probe_only": probe_only, "collisions": 0, "eaddrinuse": 0,
                               "reserve_errors": 0, "out_of_slice": 0, "children_saw_ipv6": None}
    try:
        from scaffold_core.distributed.ports import rank_slice

        for rank in range(workers):
            r, w = (0, 1) if same_slice else (rank, workers)
            cmd = [sys.executable, "-m", "scaffold_testkit.port_stress", "--child", str(r), str(w), str(ports)]
            cmd += (["--no-ipv6"] if no_ipv6 else []) + (["--probe-only"] if probe_only else [])
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, start_new_session=True))
        for _ in range(rounds):
            replies = _ask(procs, "reserve", deadline)
            seen: dict[int, int] = {}
            for rank, reply in enumerate(replies):
                if "error" in reply:
                    figures["reserve_errors"] += 1
                    figures.setdefault("first_error", reply["error"])
                    continue
                lo, hi = rank_slice(0, 1) if same_slice else rank_slice(rank, workers)
                for port in reply["ports"]:
                    figures["out_of_slice"] += not lo <= port <= hi
                    if port in seen:
                        figures["collisions"] += 1
                    seen[port] = rank
            binds = _ask(procs, "bind", deadline)
            figures["eaddrinuse"] += sum(b["eaddrinuse"] for b in binds)
            figures["children_saw_ipv6"] = any(b["ipv6"] for b in binds)
            _ask(procs, "close", deadline)
            figures["rounds"] += 1
    finally:
        for p in procs:
            try:
                p.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()
    figures["seconds"] = round(time.perf_counter() - t0, 3)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", nargs=3, type=int, metavar=("RANK", "WORLD", "PORTS"), help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--ports", type=int, default=8)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--no-ipv6", action="store_true", help="children cannot create AF_INET6 sockets")
    p.add_argument("--same-slice", action="store_true", help="every child reserves from the same slice")
    p.add_argument("--probe-only", action="store_true", help="release ports right after finding them (naive)")
    args = p.parse_args(argv)
    if args.child:
        rank, world, ports = args.child
        child(rank, world, ports, no_ipv6=args.no_ipv6, probe_only=args.probe_only)
        return 0
    figures = run(args.workers, args.ports, args.rounds, no_ipv6=args.no_ipv6, same_slice=args.same_slice,
                  probe_only=args.probe_only)
    print(json.dumps(figures))
    return 0 if figures["collisions"] == figures["eaddrinuse"] == figures["reserve_errors"] == 0 else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
