"""What `scaffold serve` costs on top of the engine: completions per second through HTTP, and added latency.

The engine is the benchmark-only canned engine (every reply instant), so what is measured is the
endpoint's own work: HTTP (uvicorn), decoding and checking the request, matching the session,
rendering the new messages, recording the call, and the response. The server runs in this process
(uvloop and httptools when installed); the clients run in a second process, as raw keep-alive
HTTP/1.1 connections (a light client, so the figure is the server's), 1, 64 and 256 of them at once.

Two workloads:

* ``session``: each client opens a session, holds a 4-turn conversation in it over chat completions
  (each request repeats the history, as agents do, and the server appends only the new message), then
  drops it. Completions per second count the chat calls; the session calls are extra work, not counted.
* ``responses``: the same conversations over OpenAI's Responses API (``POST /v1/responses``, the
  history as input items, as the Agents SDK sends it).

Added latency is the HTTP latency of a chat call minus the engine's own (measured in process);
at 64 and 256 clients it includes queueing behind the other clients. Server CPU per call (the server
process's CPU time over the calls it answered, session calls included) says what one core sustains
whatever else the machine is doing: on a busy machine the rate is bounded by the CPU the server gets.

    python bench/serve_overhead.py                      # both workloads at 1, 64, 256 clients, 5 s each
    python bench/serve_overhead.py --seconds 10 --clients 64

Goals on the 2-core machine, for each workload: >= 2,000 completions/s at 64 clients; added p99 <= 50 ms. The
machine is
shared with other work while this runs: the load average printed with the figures says how busy it was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from typing import Any

GOAL_RATE = 2000.0
GOAL_P99_MS = 50.0
CANNED = "Adding them gives 42.\n#### 42"


# -- the clients (a second process) ------------------------------------------------------------------


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 2"):
        raise RuntimeError(f"server answered {head.splitlines()[0]!r}")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return await reader.readexactly(length)


def _conversation(turns: int, workload: str) -> list[bytes]:
    """The bodies of one conversation: each repeats the history (the canned replies) and adds a question (chat
    messages, or the Responses API's input items)."""
    messages: list[dict[str, Any]] = []
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: what is 6 times 7?"})
        if workload == "responses":
            bodies.append(json.dumps({"model": "scaffold", "input": messages, "max_output_tokens": 64}).encode())
            messages.append({"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": CANNED}]})
        else:
            bodies.append(json.dumps({"model": "scaffold", "messages": messages, "max_tokens": 64}).encode())
            messages.append({"role": "assistant", "content": CANNED})
    return bodies


async def _client(port: int, workload: str, stop_at: float, latencies: list[float], warm_until: float,
                  calls: list[int]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    bodies = _conversation(4, workload)
    route = "responses" if workload == "responses" else "chat/completions"
    done = 0
    try:
        while time.perf_counter() < stop_at:
            sid = json.loads(await _exchange(reader, writer, _request("POST", "/sessions")))["id"]
            paths = [f"/sessions/{sid}/v1/{route}"] * len(bodies)
            for path, body in zip(paths, bodies):
                started = time.perf_counter()
                await _exchange(reader, writer, _request("POST", path, body))
                now = time.perf_counter()
                calls[0] += 1
                if now > warm_until:
                    latencies.append(now - started)
                    done += 1
            await _exchange(reader, writer, _request("DELETE", f"/sessions/{sid}"))
    finally:
        writer.close()
    return done


def _load(port: int, workload: str, clients: int, seconds: float, warmup: float, out: Any) -> None:
    async def main() -> dict[str, Any]:
        latencies: list[float] = []
        calls = [0]
        start = time.perf_counter()
        counts = await asyncio.gather(*(_client(port, workload, start + warmup + seconds, latencies, start + warmup,
                                                calls) for _ in range(clients)))
        elapsed = time.perf_counter() - (start + warmup)
        return {"completions": sum(counts), "seconds": elapsed, "latencies": latencies, "all_calls": calls[0]}

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out.send(asyncio.run(main()))


# -- the server (this process) -----------------------------------------------------------------------


async def _engine_latency(engine: Any, n: int = 2000) -> float:
    from scaffold_core.generation import GenerationRequest
    from scaffold_core.sampling import SamplingParams

    request = GenerationRequest("bench", [7] * 40, SamplingParams(max_tokens=64))
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await engine.generate(request)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _serve(levels: list[int], workloads: list[str], seconds: float, warmup: float) -> list[dict[str, Any]]:
    from scaffold_core.engines.canned import CannedBenchmarkEngine
    from scaffold_core.sampling import SamplingParams
    from scaffold_multiturn.tool_formats import HermesFormat
    from scaffold_serve.app import Endpoint, build_app
    from scaffold_serve.backends import EngineBackend
    from scaffold_serve.server import BackgroundServer
    from scaffold_serve.service import ChatService, ServeOptions

    engine = CannedBenchmarkEngine(response=CANNED)
    await engine.start()
    engine_s = await _engine_latency(engine)
    service = ChatService(ServeOptions(sampling=SamplingParams(max_tokens=64), max_sessions=100_000),
                          tokenizer=engine.tokenizer, tool_format=HermesFormat(), backend=EngineBackend(engine))
    server = await BackgroundServer(build_app(Endpoint(service, allow_open=True))).start()
    rows = []
    try:
        for workload in workloads:
            for clients in levels:
                receive, send = mp.get_context("spawn").Pipe(duplex=False)
                proc = mp.get_context("spawn").Process(
                    target=_load, args=(server.port, workload, clients, seconds, warmup, send))
                cpu = time.process_time()
                proc.start()
                result = await asyncio.get_running_loop().run_in_executor(None, receive.recv)
                result["server_cpu_s"] = time.process_time() - cpu
                proc.join(30)
                rows.append(_row(workload, clients, result, engine_s))
                print(_line(rows[-1]), flush=True)
    finally:
        await server.stop()
        await engine.close()
    return rows


def _row(workload: str, clients: int, result: dict[str, Any], engine_s: float) -> dict[str, Any]:
    lat = sorted(result["latencies"])

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    cpu_us = result["server_cpu_s"] / max(1, result["all_calls"]) * 1e6
    return {"workload": workload, "clients": clients, "completions_per_s": result["completions"] / result["seconds"],
            "completions": result["completions"], "engine_ms": engine_s * 1e3, "server_cpu_us_per_call": cpu_us,
            "one_core_per_s": 1e6 / cpu_us if cpu_us else float("nan"),
            "added_p50_ms": (pct(0.50) - engine_s) * 1e3, "added_p99_ms": (pct(0.99) - engine_s) * 1e3}


def _line(row: dict[str, Any]) -> str:
    return (f"{row['workload']:>8} {row['clients']:>5} clients: {row['completions_per_s']:8.0f} completions/s   "
            f"added latency p50 {row['added_p50_ms']:7.2f} ms  p99 {row['added_p99_ms']:7.2f} ms   "
            f"server CPU {row['server_cpu_us_per_call']:5.0f} us/call (one core: {row['one_core_per_s']:5.0f}/s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--workload", choices=["session", "responses"], nargs="+", default=["session", "responses"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    try:
        import uvloop

        loop_name = "uvloop"
        runner = uvloop.run
    except ImportError:
        loop_name, runner = "asyncio", asyncio.run
    try:
        import httptools  # noqa: F401

        http_name = "httptools"
    except ImportError:
        http_name = "h11"
    load = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared with other work); server on {loop_name} + {http_name}, "
          f"clients in a second process", flush=True)
    rows = runner(_serve(args.clients, args.workload, args.seconds, args.warmup))
    for row in (r for r in rows if r["clients"] == 64):
        rate, p99 = row["completions_per_s"], row["added_p99_ms"]
        print(f"goal: >= {GOAL_RATE:.0f} completions/s at 64 clients ({row['workload']}): {rate:.0f} "
              f"({'met' if rate >= GOAL_RATE else 'NOT met'}); added p99 <= {GOAL_P99_MS:.0f} ms: {p99:.1f} ms "
              f"({'met' if p99 <= GOAL_P99_MS else 'NOT met'})")
    one = [r for r in rows if r["clients"] == 1]
    for row in one:
        print(f"one client ({row['workload']}): added latency p50 {row['added_p50_ms']:.2f} ms, "
              f"p99 {row['added_p99_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
