"""Benchmark: the server engines' HTTP client (SGLang, vLLM), one client process against a fast local server.

For each engine (``--engines sglang,vllm``) prints requests/s with 1,024
requests in flight, the client's CPU time per request (CPU time of the client
process divided by requests; the server runs in its own process, so its CPU
is not counted, and is printed separately so a server-bound run shows), and
the latency the client adds (client-measured latency minus the processing
time the server reports, where it does: SGLang's ``meta_info.e2e_latency``),
p50 and p99, at 1,024 in flight and at 1. Requests go through the engine's
``generate`` (body encoding, pooled HTTP, response parsing, decoding the ids
when the server sends no text: vLLM's token endpoint), with the
garbage-collector setting the runtime uses while episodes run. Each figure is
compared with the goal (and, for SGLang, with the figures measured before the
client was tuned).

The machine line gives the cores and the load average at the start: on a
shared machine co-tenants slow runs down (wall-clock figures most, CPU per
request least), so runs are repeated and the best and the median are shown.

Two servers per engine, each in its own process:

* ``zero``: a zero-work HTTP/1.1 responder written for this benchmark (a raw
  asyncio protocol answering canned results of the engine's generation
  endpoint), so the figure measures the client.
* ``protocol``: the plugin's protocol test server (aiohttp, random tokens),
  i.e. a real HTTP server stack doing some work.

Run: ``python bench/remote_client.py`` (``--help`` for options; ``--json``
prints one JSON object instead of text; ``--profile N`` adds a cProfile of the
client side of one loaded run, top N functions by own time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_SERVERS = {"sglang": ROOT / "plugins" / "scaffold-sglang" / "tests" / "sglang_test_server.py",
                "vllm": ROOT / "plugins" / "scaffold-vllm" / "tests" / "vllm_test_server.py"}

#: What the client should reach against the zero-work server with 1,024 requests in flight.
GOAL = {"requests_per_s": 10_000.0, "client_cpu_us_per_request": 80.0}
#: This script's figures for the SGLang client before it was tuned (commit ca45b07: aiohttp for /generate,
#: stdlib json), on the 2-core development machine: the best of 5 runs, averaged over two rounds.
BEFORE = {"sglang": {"requests_per_s": 7_300.0, "client_cpu_us_per_request": 137.0}}


def canned(engine: str, tokens: int) -> bytes:
    """A generation answer of ``tokens`` tokens (the last one EOS, id 2) with ``%s`` for the request id."""
    ids = [30 + i % 200 for i in range(tokens - 1)] + [2]
    logprobs = [(-0.5, -0.25, -1.0, -0.125)[i % 4] for i in range(tokens)]
    if engine == "vllm":  # /inference/v1/generate
        content = ",".join(f'{{"token":"token_id:{t}","logprob":{lp},"bytes":null,"top_logprobs":'
                           f'[{{"token":"token_id:{t}","logprob":{lp},"bytes":null}}]}}'
                           for lp, t in zip(logprobs, ids))
        return ('{"request_id":"generate-tokens-%s","model":"zero","created":0,"choices":[{"index":0,"logprobs":'
                '{"content":[' + content + ']},"finish_reason":"stop","token_ids":[' + ",".join(map(str, ids))
                + '],"routed_experts":null}],"usage":{"prompt_tokens":8,"total_tokens":' + str(8 + tokens)
                + ',"completion_tokens":' + str(tokens) + '},"prompt_logprobs":null,"kv_transfer_params":null}'
                ).encode()
    tuples = ",".join(f"[{lp},{t},null]" for lp, t in zip(logprobs, ids))
    return ('{"output_ids":[' + ",".join(map(str, ids)) + '],"meta_info":{"id":"%s","finish_reason":'
            '{"type":"stop","matched":2},"prompt_tokens":8,"completion_tokens":' + str(tokens) + ','
            '"cached_tokens":0,"weight_version":"default","e2e_latency":0.0,"output_token_logprobs":['
            + tuples + ']}}').encode()


#: What the zero server answers a GET with (the engines read these at start).
GETS = {b"/model_info": b'{"model_path":"zero","tokenizer_path":"builtin:byte"}',
        b"/v1/models": b'{"object":"list","data":[{"id":"zero","root":"builtin:byte","max_model_len":8192}]}',
        b"/openapi.json": b'{"paths":{"/inference/v1/generate":{"post":{}}}}'}
#: Where the request id sits in each engine's request body.
RID_KEYS = {"sglang": b'"rid":"', "vllm": b'"request_id":"'}


class ZeroWork(asyncio.Protocol):
    """Answers every HTTP/1.1 request on a keep-alive connection with a canned generation result."""

    canned = canned("sglang", 4)
    rid_key = RID_KEYS["sglang"]

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
                path = head.split(b" ", 2)[1]
                out = GETS.get(path, b"{}")
            else:
                at = body.find(self.rid_key) + len(self.rid_key)
                out = self.canned % body[at:body.find(b'"', at)]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(out), out))


def serve_zero(port: int, engine: str, tokens: int) -> None:
    ZeroWork.canned = canned(engine, tokens)
    ZeroWork.rid_key = RID_KEYS[engine]

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


def start_server(engine: str, kind: str, tokens: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "zero":
        argv = [sys.executable, __file__, "--serve-zero", str(port), "--zero-engine", engine,
                "--output-tokens", str(tokens)]
    elif engine == "vllm":
        argv = [sys.executable, str(TEST_SERVERS[engine]), "serve", "bench", "--port", str(port),
                "--vocab-size", "262", "--mean-tokens", str(tokens), "--tokenizer", "builtin:byte"]
    else:
        argv = [sys.executable, str(TEST_SERVERS[engine]), "--model-path", "bench", "--port", str(port),
                "--vocab-size", "262", "--mean-tokens", str(tokens), "--tokenizer-path", "builtin:byte"]
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


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of another process so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_engine(name: str, url: str, in_flight: int):
    if name == "vllm":
        from scaffold_vllm import VLLMEngine

        return VLLMEngine(url=url, tokenizer="builtin:byte", max_connections=max(in_flight, 1))
    from scaffold_sglang import SGLangEngine

    return SGLangEngine(url=url, tokenizer="builtin:byte", max_connections=max(in_flight, 1))


async def measure(name: str, url: str, total: int, in_flight: int, server_pid: int | None = None,
                  profile: int = 0, tokens: int = 4) -> dict:
    from scaffold_core.generation import GenerationRequest
    from scaffold_core.run.aio import gc_tuned
    from scaffold_core.sampling import SamplingParams

    engine = make_engine(name, url, in_flight)
    await engine.start()
    sampling = SamplingParams(max_tokens=tokens, temperature=1.0, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 200) for _ in range(64)] for _ in range(256)]
    added: list[float] = []

    async def worker(k: int, n: int, record: bool) -> None:
        for i in range(k, n, in_flight):
            request = GenerationRequest(f"r{i}", prompts[i % len(prompts)], sampling, seed=i, episode_id=f"e{i}")
            t0 = time.perf_counter()
            result = await engine.generate(request)
            if record:
                added.append(time.perf_counter() - t0 - float(result.meta.get("e2e_latency", 0.0)))

    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    try:
        await asyncio.gather(*(worker(k, max(in_flight * 2, 200), False) for k in range(in_flight)))  # warm up
        with gc_tuned():  # as inside a rollout: the runtime runs episodes with this GC setting
            server_started = process_cpu_s(server_pid) if server_pid else None
            started, cpu_started = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            await asyncio.gather(*(worker(k, total, True) for k in range(in_flight)))
            if profiler is not None:
                profiler.disable()
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            server_ended = process_cpu_s(server_pid) if server_pid else None
    finally:
        await engine.close()
    out = {"requests": total, "in_flight": in_flight, "tokens": tokens, "wall_s": round(wall, 3),
           "requests_per_s": round(total / wall, 1),
           "client_cpu_us_per_request": round(cpu / total * 1e6, 1),
           "client_cpu_share": round(cpu / wall, 2),
           "added_latency_p50_ms": round(percentile(added, 0.50) * 1000, 3),
           "added_latency_p99_ms": round(percentile(added, 0.99) * 1000, 3)}
    if server_started is not None and server_ended is not None:
        server_cpu = server_ended - server_started
        out["server_cpu_us_per_request"] = round(server_cpu / total * 1e6, 1)
        out["server_cpu_share"] = round(server_cpu / wall, 2)  # near 1.0: the server is the bottleneck
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(profile)
        out["profile"] = text.getvalue()
    return out


def summarize(runs: list[dict]) -> dict:
    best = max(runs, key=lambda r: r["requests_per_s"])
    out = dict(best)
    out["runs"] = len(runs)
    for key in ("requests_per_s", "client_cpu_us_per_request", "added_latency_p50_ms", "added_latency_p99_ms",
                "server_cpu_us_per_request"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[f"all_{key}"] = values
            out[f"median_{key}"] = round(statistics.median(values), 1)
    out["best_client_cpu_us_per_request"] = min(r["client_cpu_us_per_request"] for r in runs)
    return out


def machine() -> dict:
    one, five, fifteen = os.getloadavg()
    return {"cpus": os.cpu_count(), "load_avg": [round(one, 2), round(five, 2), round(fifteen, 2)]}


def print_loaded(engine: str, kind: str, r: dict) -> None:
    server = ""
    if "server_cpu_us_per_request" in r:
        server = (f"; server CPU {r['server_cpu_us_per_request']} us per request "
                  f"({r['server_cpu_share']:.0%} of a core)")
    print(f"{engine} client vs {kind} server, {r['in_flight']} in flight, {r['requests']} requests per run, "
          f"{r['tokens']} output tokens per answer, {r['runs']} runs:")
    print(f"  requests/s: best {r['requests_per_s']:,.0f}, median {r['median_requests_per_s']:,.0f} "
          f"(all {r['all_requests_per_s']})")
    print(f"  client CPU per request: best {r['best_client_cpu_us_per_request']} us, median "
          f"{r['median_client_cpu_us_per_request']} us (all {r['all_client_cpu_us_per_request']}); "
          f"best run: client used {r['client_cpu_share']:.0%} of a core{server}")
    print(f"  client-added latency (best run): p50 {r['added_latency_p50_ms']} ms, p99 {r['added_latency_p99_ms']} ms")


def print_goal(engine: str, r: dict) -> None:
    rps, cpu = r["requests_per_s"], r["best_client_cpu_us_per_request"]
    before = BEFORE.get(engine)
    if before:
        print(f"  before tuning: {before['requests_per_s']:,.0f} requests/s, "
              f"{before['client_cpu_us_per_request']:g} us client CPU per request")
    print(f"  goal:          >= {GOAL['requests_per_s']:,.0f} requests/s, "
          f"<= {GOAL['client_cpu_us_per_request']:g} us client CPU per request")
    than = (f"{rps / before['requests_per_s']:.2f}x before, ", f"{before['client_cpu_us_per_request'] / cpu:.2f}x "
            "less than before, ") if before else ("", "")
    print(f"  now:           {rps:,.0f} requests/s ({than[0]}"
          f"{rps / GOAL['requests_per_s']:.2f} of the goal: {'met' if rps >= GOAL['requests_per_s'] else 'NOT met'}), "
          f"{cpu:g} us ({than[1]}{cpu / GOAL['client_cpu_us_per_request']:.2f} of the goal's budget: "
          f"{'met' if cpu <= GOAL['client_cpu_us_per_request'] else 'NOT met'})")
    if r.get("server_cpu_share", 0) >= 0.9:
        print("  note: the server process used a whole core: the run was server-bound, not client-bound")


def bench_one(engine: str, kind: str, args: argparse.Namespace) -> dict:
    """The loaded runs, a run at 1 in flight and (``--profile``) a profiled run of ``engine`` against ``kind``."""
    proc, url = start_server(engine, kind, args.output_tokens)
    profile = None
    tokens = args.output_tokens
    try:
        runs = [asyncio.run(measure(engine, url, args.requests, args.in_flight, proc.pid, tokens=tokens))
                for _ in range(max(1, args.repeat))]
        single = asyncio.run(measure(engine, url, 2000, 1, proc.pid, tokens=tokens))
        if args.profile:
            profile = asyncio.run(measure(engine, url, args.requests, args.in_flight, proc.pid,
                                          profile=args.profile, tokens=tokens))
    finally:
        stop_server(proc)
    loaded = summarize(runs)
    out = {"loaded": loaded, "single": single}
    if profile is not None:
        out["profile"] = profile["profile"]
    if not args.json:
        print_loaded(engine, kind, loaded)
        if kind == "zero" and tokens == 4:  # the goal (and SGLang's figures before) were measured this way
            print_goal(engine, loaded)
        print(f"  1 in flight: {single['requests_per_s']:,.0f} requests/s; client CPU "
              f"{single['client_cpu_us_per_request']} us per request; client-added latency p50 "
              f"{single['added_latency_p50_ms']} ms, p99 {single['added_latency_p99_ms']} ms")
        if profile is not None:
            print(f"  cProfile of one more loaded run ({profile['requests_per_s']:,.0f} requests/s under the "
                  f"profiler), client side, top {args.profile} by own time:")
            print(profile["profile"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per run at full concurrency")
    parser.add_argument("--repeat", type=int, default=5, help="runs at full concurrency; the best and the median "
                        "are reported (co-tenants on a shared machine only ever slow a run down)")
    parser.add_argument("--in-flight", type=int, default=1024)
    parser.add_argument("--engines", default="sglang,vllm", help="comma-separated: sglang, vllm")
    parser.add_argument("--servers", default="zero,protocol", help="comma-separated: zero, protocol")
    parser.add_argument("--output-tokens", type=int, default=4,
                        help="tokens per answer (the zero server's exactly, the protocol server's on average)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile one more loaded run (cProfile, client side) and print its top N functions")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve-zero", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--zero-engine", default="sglang", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_zero:
        serve_zero(args.serve_zero, args.zero_engine, args.output_tokens)
        return 0
    at_start = machine()
    if not args.json:
        print(f"machine: {at_start['cpus']} CPUs; load average {at_start['load_avg'][0]:.2f} / "
              f"{at_start['load_avg'][1]:.2f} / {at_start['load_avg'][2]:.2f} (1/5/15 min) at the start")
    results: dict = {}
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        for kind in [k.strip() for k in args.servers.split(",") if k.strip()]:
            results[f"{engine}/{kind}"] = bench_one(engine, kind, args)
    at_end = machine()
    if args.json:
        print(json.dumps({"remote_client": results, "goal": GOAL, "before": BEFORE,
                          "machine_at_start": at_start, "machine_at_end": at_end}))
    else:
        print(f"(load average {at_end['load_avg'][0]:.2f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
