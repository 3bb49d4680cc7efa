"""Benchmark: the sglang engine's HTTP client, one client process against a fast local server process.

Prints requests/s with 1,024 requests in flight, and the latency the client
adds (client-measured latency minus the processing time the server reports
in ``meta_info.e2e_latency``), p50 and p99, at 1,024 in flight and at 1.
Requests go through ``SGLangEngine.generate`` (body encoding, pooled HTTP,
response parsing), with the garbage-collector setting the runtime uses while
episodes run. The client's CPU time per request is printed too: on a shared
machine it says what one core would sustain.

Two servers, each in its own process:

* ``zero``: a zero-work HTTP/1.1 responder written for this benchmark (canned
  ``/generate`` answers), so the figure measures the client.
* ``protocol``: the plugin's protocol test server (aiohttp, random tokens),
  i.e. a real HTTP server stack doing some work.

Run: ``python bench/sglang_client.py`` (``--help`` for options; ``--json``
prints one JSON object instead of text).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_SERVER = ROOT / "plugins" / "scaffold-sglang" / "tests" / "sglang_test_server.py"

CANNED = (b'{"output_ids":[30,31,32,2],"meta_info":{"id":"%s","finish_reason":{"type":"stop","matched":2},'
          b'"prompt_tokens":8,"completion_tokens":4,"cached_tokens":0,"weight_version":"default",'
          b'"e2e_latency":0.0,"output_token_logprobs":[[-0.5,30,null],[-0.25,31,null],[-1.0,32,null],'
          b'[-0.125,2,null]]}}')


class ZeroWork(asyncio.Protocol):
    """Answers every HTTP/1.1 request on a keep-alive connection with a canned ``/generate`` result."""

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            if head.startswith(b"get"):
                out = b'{"model_path":"zero","tokenizer_path":"builtin:byte"}' if b"model_info" in head else b"{}"
            else:
                at = body.find(b'"rid":"')
                out = CANNED % body[at + 7:body.find(b'"', at + 7)]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(out), out))


def serve_zero(port: int) -> None:
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(ZeroWork, "127.0.0.1", port, backlog=4096)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(kind: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "zero":
        argv = [sys.executable, __file__, "--serve-zero", str(port)]
    else:
        argv = [sys.executable, str(TEST_SERVER), "--model-path", "bench", "--port", str(port),
                "--vocab-size", "262", "--mean-tokens", "4", "--tokenizer-path", "builtin:byte"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the {kind} server exited with code {proc.returncode}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the {kind} server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, total: int, in_flight: int) -> dict:
    from scaffold_core.generation import GenerationRequest
    from scaffold_core.run.runtime import gc_tuned
    from scaffold_core.sampling import SamplingParams
    from scaffold_sglang import SGLangEngine

    engine = SGLangEngine(url=url, tokenizer="builtin:byte", max_connections=max(in_flight, 1))
    await engine.start()
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 200) for _ in range(64)] for _ in range(256)]
    added: list[float] = []

    async def worker(k: int, n: int, record: bool) -> None:
        for i in range(k, n, in_flight):
            request = GenerationRequest(f"r{i}", prompts[i % len(prompts)], sampling, episode_id=f"e{i}")
            t0 = time.perf_counter()
            result = await engine.generate(request)
            if record:
                added.append(time.perf_counter() - t0 - float(result.meta.get("e2e_latency", 0.0)))

    try:
        await asyncio.gather(*(worker(k, max(in_flight * 2, 200), False) for k in range(in_flight)))  # warm up
        with gc_tuned():  # as inside a rollout: the runtime runs episodes with this GC setting
            started, cpu_started = time.perf_counter(), time.process_time()
            await asyncio.gather(*(worker(k, total, True) for k in range(in_flight)))
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await engine.close()
    return {"requests": total, "in_flight": in_flight, "wall_s": round(wall, 3),
            "requests_per_s": round(total / wall, 1),
            "client_cpu_us_per_request": round(cpu / total * 1e6, 1),
            "requests_per_client_cpu_s": round(total / cpu, 1),
            "added_latency_p50_ms": round(percentile(added, 0.50) * 1000, 3),
            "added_latency_p99_ms": round(percentile(added, 0.99) * 1000, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per run at full concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="runs at full concurrency; the best is reported "
                        "(co-tenants on a shared machine only ever slow a run down)")
    parser.add_argument("--in-flight", type=int, default=1024)
    parser.add_argument("--servers", default="zero,protocol", help="comma-separated: zero, protocol")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve-zero", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_zero:
        serve_zero(args.serve_zero)
        return 0
    sys.path.insert(0, str(ROOT / "plugins" / "scaffold-sglang"))
    results = {}
    for kind in [k.strip() for k in args.servers.split(",") if k.strip()]:
        proc, url = start_server(kind)
        try:
            runs = [asyncio.run(measure(url, args.requests, args.in_flight)) for _ in range(max(1, args.repeat))]
            loaded = max(runs, key=lambda r: r["requests_per_s"])
            loaded["all_runs_requests_per_s"] = [r["requests_per_s"] for r in runs]
            single = asyncio.run(measure(url, 2000, 1))
        finally:
            stop_server(proc)
        results[kind] = {"loaded": loaded, "single": single}
        if not args.json:
            print(f"sglang client vs {kind} server: {loaded['requests_per_s']:,.0f} requests/s with "
                  f"{loaded['in_flight']} in flight (best of {loaded['all_runs_requests_per_s']}; "
                  f"{loaded['requests']} requests in {loaded['wall_s']} s); "
                  f"client-added latency p50 {loaded['added_latency_p50_ms']} ms, "
                  f"p99 {loaded['added_latency_p99_ms']} ms; client CPU {loaded['client_cpu_us_per_request']} us "
                  f"per request ({loaded['requests_per_client_cpu_s']:,.0f} requests per client CPU-second)")
            print(f"sglang client vs {kind} server: 1 in flight: {single['requests_per_s']:,.0f} requests/s; "
                  f"client-added latency p50 {single['added_latency_p50_ms']} ms, "
                  f"p99 {single['added_latency_p99_ms']} ms")
    if args.json:
        print(json.dumps({"sglang_client": results, "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}))
    else:
        print(f"(machine: {os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.2f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
