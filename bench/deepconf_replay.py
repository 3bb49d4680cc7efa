r"""DeepConf online, tuned by trace replay: record full traces once, then simulate the controller over many settings.

``record`` runs ``scaling_methods.py``'s engine and task setup (same problems, same sampling, same
per-request seeds) and keeps, for every problem, ``--traces`` full traces with every token's logprob and
top-20 logprobs (what the ``deepconf`` controller sees) and the verifier's verdict, in a pickle under
/tmp. Trace ``i`` is the sample ``majority@8`` and DeepConf's warm-up would get as their trace ``i``.

``simulate`` replays DeepConf online on those traces for a grid of settings in seconds: warm-up traces
set the threshold, later traces are cut at the first chunk boundary where a window's confidence fell
below it (counting every token up to that boundary, as the controller does), the vote's consensus is
checked before each round, and the voters vote. Confidences, the percentile, the sliding windows and
the vote are the plugin's own functions; the control flow mirrors ``DeepConfController._online``, and
``--check`` runs the real controller's generator on the replayed tokens (a stand-in engine that
serves the recorded traces) and asserts it agrees with the simulation, problem by problem.

Why replay is faithful: the controller generates a later trace in chunks, each chunk sampled from the
model given the prompt and the trace so far, at the same temperature. The distribution of a trace's
first ``t`` tokens is therefore the same whether it is generated in one call or in chunks, and
stopping depends only on the tokens generated so far. So a recorded full trace, cut where the
controller would have stopped it, is a sample of what the controller would have generated (chunked
generation draws other random numbers, so a real run samples other traces of the same distribution:
compare runs statistically, not token for token). ``--draws`` averages over random orders of the
recorded traces (which ones are the warm-up, which come later) for a less noisy estimate than the
one order a real run uses (``--draws 0``: traces in recorded order, as a real run would number them).

    python bench/deepconf_replay.py record --seed 1 --problems 40 --traces 16 --threads 1   # 9 min on 1 core
    python bench/deepconf_replay.py simulate /tmp/deepconf_traces_s1_p40_t16.pkl --draws 50 --check
    python bench/deepconf_replay.py simulate /tmp/deepconf_traces_s1_p40_t16.pkl --draws 400 --keep 0.8,0.9,1.0 \
        --warmup 2 --window 3,4,5,6 --chunk 4 --consensus 0.67,0.7,0.72,0.75 --weighted True,False --measure sampled

Printed per setting: ``met`` (the share of trace orders where the goal, majority@8's accuracy within 2
points with at most 60% of its tokens, holds), the mean accuracy, tokens per problem and their ratio to
majority@8's, and the same for the recorded order alone.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import math
import pickle
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scaling_methods  # noqa: E402  (the bench next to this file)


# -- record --------------------------------------------------------------------------------------------
def _recorder(traces: int) -> Any:
    from scaffold_core.episode import Outcome
    from scaffold_methods.accounting import TokenCount, verify_texts
    from scaffold_methods.deepconf import DeepConfController

    class Record(DeepConfController):
        """``traces`` full traces with top logprobs (the controller's own requests), each kept in metadata."""

        def process(self, ctx: Any) -> Any:
            count = TokenCount()
            full = yield from self._full_traces(ctx, range(self.samples), count)
            samples = [t.to_sample(ctx) for t in full]
            verdicts = yield from verify_texts(ctx, [s.text for s in samples])
            for sample, trace, verdict in zip(samples, full, verdicts):
                sample.verdict = verdict
                sample.metadata["replay"] = {
                    "ids": list(trace.output_ids),
                    "logprobs": list(trace.logprobs),
                    "top": trace.generated_top(),
                    "finish": trace.finish_reason,
                    "text": sample.text,
                    "key": verdict.vote_key,
                    "correct": verdict.reward > 0,
                    "extracted": verdict.extracted,
                    "reward": verdict.reward,
                }
            return Outcome(samples=samples, metrics=count.metrics())

    return Record(samples=traces)


def record(args: argparse.Namespace) -> Path:
    problems: dict[int, list[dict[str, Any]]] = {}

    def keep(_: str, result: Any) -> None:
        if not result.ok:
            raise RuntimeError(f"episode {result.episode_id} failed: {result.error}")
        problems[result.index] = [s.metadata["replay"] for s in sorted(result.samples, key=lambda s: s.sample_index)]

    started = time.perf_counter()
    asyncio.run(scaling_methods.run_all(args, [(f"record {args.traces}", lambda: _recorder(args.traces))], keep))
    out = Path(args.out or f"/tmp/deepconf_traces_s{args.seed}_p{args.problems}_t{args.traces}.pkl")
    meta = {k: getattr(args, k) for k in ("seed", "problems", "traces", "max_tokens", "temperature")}
    with open(out, "wb") as f:
        pickle.dump({"meta": meta, "problems": [problems[i] for i in sorted(problems)]}, f)
    print(f"{len(problems)} problems x {args.traces} traces -> {out} ({time.perf_counter() - started:.0f} s)")
    return out


# -- simulate ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """The online options ``simulate`` varies (``samples`` is the trace budget N)."""

    keep: float
    warmup: int
    window: int
    chunk: int
    per_round: int = 1
    consensus: float | None = 0.7
    weighted: bool = True
    measure: str = "top_k"
    samples: int = 8

    def options(self) -> dict[str, Any]:
        """The ``DeepConfController`` keyword arguments of this setting."""
        return {
            "samples": self.samples,
            "mode": "online",
            "keep": self.keep,
            "warmup": self.warmup,
            "window": self.window,
            "chunk": self.chunk,
            "per_round": self.per_round,
            "consensus": self.consensus,
            "weighted": self.weighted,
            "measure": self.measure,
        }

    def label(self) -> str:
        return (
            f"keep {self.keep:g} warmup {self.warmup} window {self.window} chunk {self.chunk} "
            f"per_round {self.per_round} consensus {self.consensus} weighted {self.weighted} measure {self.measure} "
            f"samples {self.samples}"
        )


class Recorded:
    """One recorded trace: its tokens, verdict and token confidences, with group confidences per window."""

    def __init__(self, raw: dict[str, Any]):
        from scaffold_methods.confidence import token_confidences

        self.raw = raw
        self.tokens = len(raw["ids"])
        self.key, self.correct = raw["key"], bool(raw["correct"])
        self.confidences = {m: token_confidences(raw["logprobs"], raw["top"], m)[0] for m in ("top_k", "sampled")}
        self._groups: dict[tuple[int, str], tuple[list[float], float]] = {}

    def _scan(self, window: int, measure: str) -> tuple[list[float], float]:
        """(the running minimum of the group confidences, negated for bisect; the lowest group confidence)."""
        key = (window, measure)
        if key not in self._groups:
            from scaffold_methods.confidence import GroupConfidence, trace_confidence

            groups = GroupConfidence(window)
            groups.add(self.confidences[measure])
            running = [-m for m in itertools.accumulate(groups.groups, min)]
            # a trace shorter than one window has no group to stop it; its score is the mean of its tokens
            lowest = -running[-1] if running else trace_confidence(self.confidences[measure], window, "lowest_group")
            self._groups[key] = (running, lowest)
        return self._groups[key]

    def lowest(self, window: int, measure: str) -> float:
        """The trace's lowest group confidence (the mean of all tokens when shorter than one window)."""
        return self._scan(window, measure)[1]

    def cut(self, s: Setting, threshold: float) -> tuple[int, float | None]:
        """(tokens generated, lowest group confidence or None if stopped) when generated in chunks of ``chunk``.

        The controller checks the windows a chunk completed after each chunk: a window ending at token ``e``
        below the threshold stops the trace at the end of the chunk holding ``e`` (the trace's own end if
        sooner: a last chunk holds fewer tokens), and every token up to there counts.
        """
        running, lowest = self._scan(s.window, s.measure)
        j = bisect.bisect_right(running, -threshold)  # the first window below the threshold
        if j == len(running):
            return self.tokens, lowest
        return min(math.ceil((j + s.window) / s.chunk) * s.chunk, self.tokens), None


def simulate(order: list[Recorded], s: Setting) -> dict[str, Any]:
    """DeepConf online on traces ``order`` (warm-up first), as ``DeepConfController._online`` runs it."""
    from scaffold_methods.confidence import percentile, weighted_vote

    warm = order[: s.warmup]
    lowest = [t.lowest(s.window, s.measure) for t in warm]
    threshold = percentile(lowest, 100.0 * (1.0 - s.keep))
    voters = [(t, score) for t, score in zip(warm, lowest) if score >= threshold]
    tokens = sum(t.tokens for t in warm)

    def vote() -> tuple[Any, float, float]:
        return weighted_vote([t.key for t, _ in voters], [w if s.weighted else 1.0 for _, w in voters])

    started, stopped = len(warm), 0
    while started < s.samples:
        _, top, total = vote()
        if s.consensus is not None and total > 0 and top / total >= s.consensus:
            break
        for trace in order[started : min(s.samples, started + s.per_round)]:
            started += 1
            used, score = trace.cut(s, threshold)
            tokens += used
            if score is None:
                stopped += 1
            elif score >= threshold:
                voters.append((trace, score))
    key, _, _ = vote()
    correct = key is not None and next(t for t, _ in voters if t.key == key).correct
    return {"correct": correct, "tokens": tokens, "traces": started, "stopped": stopped, "voters": len(voters)}


def majority(order: list[Recorded], samples: int = 8) -> dict[str, Any]:
    """majority@N on the first ``samples`` traces (ties to the answer seen first, as ``majority_vote``)."""
    votes: dict[Any, int] = {}
    for t in order[:samples]:
        if t.key is not None:
            votes[t.key] = votes.get(t.key, 0) + 1
    key = max(votes, key=lambda k: votes[k]) if votes else None
    correct = key is not None and next(t for t in order if t.key == key).correct
    return {"correct": correct, "tokens": sum(t.tokens for t in order[:samples])}


def orders(problems: list[list[Recorded]], draws: int, seed: int = 0) -> list[list[list[Recorded]]]:
    """Draw 0 is the recorded order (what a real run numbers trace 0, 1, ...); then ``draws`` random orders."""
    rng = random.Random(seed)
    out = [problems]
    for _ in range(draws):
        out.append([rng.sample(traces, len(traces)) for traces in problems])
    return out


def evaluate(draws: list[list[list[Recorded]]], s: Setting, baseline: list[tuple[int, int]]) -> dict[str, float]:
    """Accuracy and tokens per problem of ``s`` over every draw, against ``baseline`` (majority's (correct,
    tokens) per draw); ``met``: the share of draws where online is within 2 points of majority's accuracy
    with <= 60% of its tokens (the goal); ``first_*``: the recorded order alone."""
    acc, tok, met, n = [], [], [], len(draws[0])
    for problems, (base_correct, base_tokens) in zip(draws, baseline):
        runs = [simulate(order, s) for order in problems]
        acc.append(sum(r["correct"] for r in runs))
        tok.append(sum(r["tokens"] for r in runs))
        met.append(acc[-1] >= base_correct - 0.02 * n - 1e-9 and tok[-1] <= 0.6 * base_tokens)
    return {
        "acc": sum(acc) / len(acc) / n,
        "tokens": sum(tok) / len(tok) / n,
        "ratio": sum(tok) / sum(t for _, t in baseline),
        "met": sum(met) / len(met),
        "first_acc": acc[0] / n,
        "first_ratio": tok[0] / baseline[0][1],
    }


#: the default grid (576 settings: about a minute with 50 draws); every axis is a command-line option
GRID = {
    "keep": [0.1, 0.5, 0.9, 1.0],
    "warmup": [2, 3, 4],
    "window": [4, 8, 16],
    "chunk": [4, 16],
    "per_round": [1],
    "consensus": [0.6, 0.7, 0.8, None],
    "weighted": [True],
    "measure": ["top_k", "sampled"],
    "samples": [8],
}


def load(path: str) -> tuple[dict[str, Any], list[list[Recorded]]]:
    with open(path, "rb") as f:
        data = pickle.load(f)
    return data["meta"], [[Recorded(raw) for raw in traces] for traces in data["problems"]]


# -- check: the real controller on the replayed traces -------------------------------------------------
def _contexts(meta: dict[str, Any]) -> list[Any]:
    """The bench's episode contexts (same problems, prompts, sampling and seeds), with the bundled tokenizer."""
    from transformers import AutoTokenizer

    from scaffold_core.engines.model_loading import cached_model_dir, resolve_model
    from scaffold_core.sampling import SamplingParams
    from scaffold_core.task import episode_context
    from scaffold_methods.arithmetic import ArithmeticTask

    source = resolve_model(None)
    cached = cached_model_dir(source)
    tokenizer = (
        AutoTokenizer.from_pretrained(str(cached))
        if cached is not None
        else AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    )
    task = ArithmeticTask(count=meta["problems"], seed=meta["seed"])
    sampling = SamplingParams(max_tokens=meta["max_tokens"], temperature=meta["temperature"], seed=meta["seed"])
    return [episode_context(task, i, row, tokenizer, sampling) for i, row in enumerate(task.load())]


def replay_controller(controller: Any, ctx: Any, order: list[Recorded], verifier: Any) -> Any:
    """Drive ``controller.process(ctx)`` with a stand-in engine: a call for sample ``i`` continuing after
    ``n`` generated tokens gets the next tokens of recorded trace ``order[i]``."""
    from scaffold_core.generation import GenerationResult, GenerationTask, VerificationTask

    gen, sent = controller.process(ctx), None
    while True:
        try:
            tasks = gen.send(sent)
        except StopIteration as stop:
            return stop.value
        for task in tasks:
            if isinstance(task, GenerationTask):
                raw = order[task.sample_index - ctx.sample_base].raw
                start = len(task.prompt_ids) - len(ctx.prompt_ids)
                end = min(start + task.sampling.max_tokens, len(raw["ids"]))
                ids = raw["ids"][start:end]
                whole = start == 0 and end == len(raw["ids"])
                text = raw["text"] if whole else ctx.tokenizer.decode(ids, skip_special_tokens=True)
                task.result = GenerationResult(
                    ids,
                    raw["logprobs"][start:end],
                    raw["finish"] if end == len(raw["ids"]) else "length",
                    text,
                    top_logprobs=raw["top"][start:end],
                )
            elif isinstance(task, VerificationTask):
                task.verdict = verifier.verify(task.response, task.reference)
            else:
                raise TypeError(f"replay serves generations and verifications, not {type(task).__name__}")
        sent = tasks


def check(meta: dict[str, Any], draws: list[list[list[Recorded]]], settings: list[Setting]) -> None:
    """Assert that the controller, fed the replayed traces, does what ``simulate`` says, problem by problem."""
    from scaffold_methods.arithmetic import ArithmeticVerifier
    from scaffold_methods.deepconf import DeepConfController

    contexts, verifier, episodes = _contexts(meta), ArithmeticVerifier(), 0
    for s in settings:
        for problems in draws:
            for ctx, order in zip(contexts, problems):
                ctx.state.clear()  # the per-sample task counters: each replay starts afresh
                outcome = replay_controller(DeepConfController(**s.options()), ctx, order, verifier)
                m = outcome.metrics
                real = {
                    "correct": (outcome.answer_reward or 0.0) > 0,
                    "tokens": int(m["policy_tokens"]),
                    "traces": int(m["traces"]),
                    "stopped": int(m["stopped_traces"]),
                    "voters": int(m["voters"]),
                }
                simulated = simulate(order, s)
                if real != simulated:
                    raise AssertionError(f"{s.label()}, problem {ctx.index}: controller {real}, simulation {simulated}")
                episodes += 1
    print(f"check: the controller on the replayed traces agrees with the simulation on {episodes} episodes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record full traces (slow: runs the model)")
    rec.add_argument("--problems", type=int, default=40)
    rec.add_argument("--seed", type=int, default=1)
    rec.add_argument("--traces", type=int, default=16)
    rec.add_argument("--max-tokens", type=int, default=64)
    rec.add_argument("--temperature", type=float, default=0.7)
    rec.add_argument("--batch", type=int, default=48)
    rec.add_argument("--threads", type=int, default=None)
    rec.add_argument("--out", default=None)
    rec.set_defaults(no_replay=False, methods="")
    sim = sub.add_parser("simulate", help="replay DeepConf online over a grid of settings (seconds)")
    sim.add_argument("traces", help="a file from record")
    sim.add_argument("--draws", type=int, default=50, help="random trace orders besides the recorded one")
    sim.add_argument("--check", action="store_true", help="also run the controller itself on the replayed traces")
    sim.add_argument("--top", type=int, default=25, help="settings printed")
    sim.add_argument("--baseline", type=int, default=8, help="compare with majority@N of this N")
    for name, values in GRID.items():
        sim.add_argument(
            f"--{name.replace('_', '-')}",
            default=",".join(map(str, values)),
            help=f"comma-separated (default {','.join(map(str, values))})",
        )
    args = parser.parse_args()
    if args.command == "record":
        record(args)
        return 0
    meta, problems = load(args.traces)
    parse = {
        "keep": float,
        "warmup": int,
        "window": int,
        "chunk": int,
        "per_round": int,
        "consensus": lambda v: None if v == "None" else float(v),
        "weighted": lambda v: v == "True",
        "measure": str,
        "samples": int,
    }
    axes = {name: [parse[name](v) for v in getattr(args, name).split(",")] for name in GRID}
    if max(args.baseline, *axes["samples"]) > meta["traces"]:
        parser.error(f"budgets up to {meta['traces']} (the traces recorded per problem)")
    settings = [Setting(**dict(zip(axes, values))) for values in itertools.product(*axes.values())]
    settings = [s for s in settings if s.warmup <= s.samples]
    draws = orders(problems, args.draws)
    baseline = []
    for draw in draws:
        runs = [majority(order, args.baseline) for order in draw]
        baseline.append((sum(r["correct"] for r in runs), sum(r["tokens"] for r in runs)))
    n = len(problems)
    started = time.perf_counter()
    if args.check:
        check(meta, draws[:3], settings)
    rows = [(evaluate(draws, s, baseline), s) for s in settings]
    rows.sort(key=lambda r: (-r[0]["met"], -r[0]["acc"], r[0]["ratio"]))
    print(
        f"{meta}: {len(settings)} settings x {len(draws)} orders in {time.perf_counter() - started:.0f} s; "
        f"majority@{args.baseline} {100 * sum(c for c, _ in baseline) / len(baseline) / n:.1f}% at "
        f"{sum(t for _, t in baseline) / len(baseline) / n:.1f} tokens "
        f"(recorded order: {100 * baseline[0][0] / n:.1f}% at {baseline[0][1] / n:.1f})"
    )
    print(
        f"met: share of orders where online is within 2 points of majority@{args.baseline}'s accuracy with <= 0.60x "
        "its tokens; first: the recorded order"
    )
    print(f"{'met':>5} {'acc':>6} {'tokens':>7} {'ratio':>6} {'first acc':>9} {'ratio':>6}  setting")
    for r, s in rows[: args.top]:
        print(
            f"{r['met']:5.2f} {100 * r['acc']:5.1f}% {r['tokens']:7.1f} {r['ratio']:6.2f} "
            f"{100 * r['first_acc']:8.1f}% {r['first_ratio']:6.2f}  {s.label()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
