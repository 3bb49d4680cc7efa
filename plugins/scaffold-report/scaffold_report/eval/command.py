"""``scaffold eval``: ``max(k)`` answers per problem with the configured controller, then the figures per k.

The configured controller is wrapped in the built-in ``repeat`` controller
(``n = max(k)`` independent runs per problem, see
:mod:`scaffold_core.builtins.repeat`) and the run is an ordinary run: the same
output directory, store, resume and workers. At the end the figures are
computed from the store (:mod:`.figures`) and written to ``eval.json`` with
the config and the versions that produced them.

``--resume`` continues a run in the same directory, or reuses a finished one:
its answers are kept, and the figures are computed again for the ks asked for
(up to the answers per problem it has). With ``--force-config`` and another
verifier, the saved answers are re-scored with it first (:mod:`.rescore`), so
the figures never mix two verifiers.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaffold_core.config import ComponentConfig, Config
from scaffold_core.errors import ConfigError
from scaffold_core.output.files import atomic_write_text
from scaffold_core.output.reader import EVAL_FILE, EpisodeReader, read_config
from scaffold_core.run.provenance import versions

from .answers import Problems, read_problems
from .figures import METRICS, Bootstrap, eval_figures, figure

#: How best-of-N picks among k answers: ``reward`` (the run's verifier), ``logprob`` (the model's mean
#: token logprob), or the name of another installed verifier (a reward model) scoring each answer.
SELECTIONS = ("reward", "logprob")
TIES = ("every answer tied for first place (equal vote counts for majority@k, equal scores for best_of_n@k) is "
        "equally likely to be picked: a tie earns the fraction of the tied answers that are correct; answers "
        "without a key cast no vote, and k answers with no vote earn 0")
FORMAT = 1


@dataclass
class EvalResult:
    """What ``scaffold eval`` produced: the run's metrics, ``eval.json``'s content, where, the engine tokenizer."""

    metrics: dict[str, Any]
    figures: dict[str, Any]
    directory: Path
    tokenizer: Any = None


def answers_per_run(config: Config, ks: list[int], output_dir: Path | None, resume: bool) -> int:
    """``max(ks)``, or, resuming a run with more answers per problem, that run's number (its answers are kept)."""
    n = max(ks)
    if not resume or output_dir is None:
        return n
    saved = read_config(output_dir)
    controller = (saved[1].get("controller") if saved else None) or {}
    if controller.get("name") != "repeat" or not isinstance(controller.get("n"), int):
        return n
    if controller["n"] < n:
        raise ConfigError(f"--k: {output_dir} holds {controller['n']} answers per problem, fewer than k={n}; ask "
                          f"for k up to {controller['n']}, or evaluate into a new directory with -o")
    return int(controller["n"])


def repeat_config(config: Config, n: int, registry: Any) -> Config:
    """``config`` with its controller run ``n`` times per problem by ``repeat`` (re-wrapped if it already is)."""
    inner = config.controller
    if inner.name == "repeat":
        spec = inner.options.get("controller") or {"name": "native"}
        inner = ComponentConfig(spec if isinstance(spec, str) else spec.get("name", "native"),
                                {} if isinstance(spec, str) else {k: v for k, v in spec.items() if k != "name"})
    wrapped = ComponentConfig("repeat", {"n": n, "controller": inner.to_dict()})
    registry.create("controller", "repeat", wrapped.options, path="controller")  # a ConfigError before any load
    config.controller = wrapped
    return config


def run_answers(config: Config, *, output_dir: str | Path | None, resume: bool, progress: bool | None,
                force_config: bool, plugins: Any = None, teacher: Any = None) -> tuple[dict[str, Any], Path, Any]:
    """Run the (wrapped) config as ``scaffold run`` would: (metrics, output directory, engine tokenizer).
    ``teacher``: a :class:`~scaffold_core.teacher.Teacher` scoring every answer's tokens."""
    if config.rollout.workers > 1 or config.rollout.launcher != "local":
        if teacher is not None:
            raise ConfigError("--teacher scores the answers in this process: run the eval with rollout.workers: 1 "
                              "and the local launcher (or score a finished eval again with --resume and --teacher)")
        from scaffold_core.launch import run_workers

        metrics = run_workers(config, output_dir=output_dir, resume=resume, progress=progress,
                              force_config=force_config)
        return metrics, Path(metrics.get("output_dir") or output_dir or "."), None
    import sys

    from scaffold_core.run.rollout import Rollout

    rollout = Rollout(config, output_dir=output_dir, resume=resume, progress=progress, force_config=force_config,
                      plugins=plugins, answers_per_episode=int(config.controller.options.get("n") or 1),
                      teacher=teacher)
    print(f"scaffold: writing to {rollout.dir}", file=sys.stderr)
    metrics = rollout.run()
    return metrics, rollout.dir, getattr(rollout.components.engine, "tokenizer", None)


def score_answers(problems: Problems, select: str, registry: Any, timeout: float = 30.0) -> None:
    """Set each answer's selection score for best-of-N: its reward, its mean logprob, or another verifier's."""
    answers = [(p, a) for p in problems.problems for a in p.answers]
    if select == "reward":
        for _, a in answers:
            a.score = a.reward
        return
    if select == "logprob":
        for _, a in answers:
            a.score = a.logprob
        return
    verifier = registry.create("verifier", select, {}, path="--select")
    verdicts = asyncio.run(_verify(verifier, select, [(a.response, p.reference) for p, a in answers], timeout))
    for (_, a), verdict in zip(answers, verdicts):
        a.score = verdict


async def _verify(verifier: Any, name: str, items: list[tuple[str, Any]], timeout: float) -> list[float | None]:
    from scaffold_core.errors import VerifierError
    from scaffold_core.run.verifier_pool import VerifierPool

    pool = VerifierPool(verifier, timeout=timeout, workers=2, name=name)
    out: list[float | None] = []
    try:
        for item in items:  # one at a time: an answer the scorer cannot score ranks last, the others still count
            try:
                out.append((await pool.verify_many([item]))[0].reward)
            except VerifierError:
                out.append(None)
        return out
    finally:
        pool.close()


def compute_eval(directory: Path, ks: list[int], *, select: str = "reward", registry: Any = None,
                 bootstrap: Bootstrap | None = None) -> dict[str, Any]:
    """The figures of the run in ``directory`` for ``ks`` (what ``eval.json`` holds, less config and versions)."""
    with EpisodeReader(directory) as reader:
        problems = read_problems(reader.heads())
        kl = teacher_kl_figures(reader, bootstrap or Bootstrap())
    score_answers(problems, select, registry)
    bootstrap = bootstrap or Bootstrap()
    figures = eval_figures(problems, ks, bootstrap=bootstrap)
    return {"format": FORMAT, "k": ks, "metrics": list(METRICS), "select": select, "ties": TIES,
            "bootstrap": {"resamples": bootstrap.resamples, "confidence": bootstrap.confidence,
                          "seed": bootstrap.seed, "over": "problems"}, **figures,
            **({"teacher_kl": kl} if kl else {})}


def sample_teacher_kl(sequence: dict[str, Any]) -> tuple[float, int] | None:
    """(sum, count) over one stored training sequence's generated tokens (loss mask 1) of the student's
    logprob minus the teacher's; None when no teacher scored it."""
    teacher = sequence.get("teacher_logprobs")
    if not isinstance(teacher, list):
        return None
    pairs = [(s, t) for m, s, t in zip(sequence.get("loss_mask") or [], sequence.get("logprobs") or [], teacher)
             if m]
    return (sum(s - t for s, t in pairs), len(pairs)) if pairs else None


def teacher_kl_figures(reader: EpisodeReader, bootstrap: Bootstrap) -> dict[str, Any] | None:
    """The teacher-student KL of the answers a teacher scored (``scaffold eval --teacher``): per answer, the
    mean over its generated tokens of ``logprob - teacher_logprob`` (the per-token reverse-KL estimate,
    against the distribution the answers were sampled from); the mean over answers with its interval (bootstrap
    over problems), the mean per token, the largest answer's, and each answer's. None when no answer was
    scored."""
    per_problem: list[float] = []
    samples: list[dict[str, Any]] = []
    total, tokens = 0.0, 0
    checked = False
    for position in range(len(reader)):
        record = reader.record(position)
        if not checked and record.get("trajectories"):  # the first episode with sequences tells: scored or not
            if not any(isinstance(t.get("teacher_logprobs"), list) for t in record["trajectories"]):
                return None
            checked = True
        values = []
        for sequence in record.get("trajectories") or []:
            got = sample_teacher_kl(sequence)
            if got is None:
                continue
            values.append(got[0] / got[1])
            total, tokens = total + got[0], tokens + got[1]
            samples.append({"episode_id": record["episode_id"], "sample_index": sequence.get("sample_index"),
                            "teacher_kl": round(got[0] / got[1], 6), "tokens": got[1]})
        if values:
            per_problem.append(sum(values) / len(values))
    if not samples:
        return None
    mean = figure([s["teacher_kl"] for s in samples], bootstrap)
    return {"answers": len(samples), "value": mean["value"], "ci": bootstrap.interval(per_problem),
            "per_token": round(total / tokens, 6), "max_answer": max(s["teacher_kl"] for s in samples),
            "by_answer": samples}


def greedy_warning(config: Config, n: int) -> str | None:
    """The warning for ``n`` > 1 answers per problem decoded greedily (temperature 0): they are all the same
    answer, so pass@k, majority@k and best-of-N@k equal pass@1; None otherwise."""
    if n <= 1 or config.sampling.temperature != 0:
        return None
    return (f"scaffold: WARNING: {n} answers per problem at sampling.temperature=0 (greedy decoding) are {n} "
            "copies of one answer: every figure for k > 1 equals k = 1. Sample them with --set "
            "sampling.temperature=0.7 (or another value above 0), or ask for --k 1")


def run_eval(config: Config, ks: list[int], *, output_dir: str | Path | None = None, resume: bool = False,
             progress: bool | None = None, force_config: bool = False, select: str = "reward",
             bootstrap: Bootstrap | None = None, plugins: Any = None,
             teacher: dict[str, Any] | Any = None) -> EvalResult:
    """Run ``config`` with ``max(ks)`` answers per problem, compute the figures, write ``eval.json``.
    ``teacher``: a teacher's options (as a trainer's ``teacher:``, see :func:`~scaffold_core.teacher.make_teacher`):
    or a :class:`~scaffold_core.teacher.Teacher` (not started): it scores every answer's tokens, and the figures
    gain the teacher-student KL (``teacher_kl``)."""
    if plugins is None:
        from scaffold_core.plugins import get_plugins

        plugins = get_plugins()
    registry = plugins.registry
    if select not in SELECTIONS:  # an unknown name, or one that cannot be built, fails here before any model loads
        registry.create("verifier", select, {}, path="--select")
    n = answers_per_run(config, ks, Path(output_dir) if output_dir is not None else None, resume)
    warning = greedy_warning(config, n)
    if warning:
        import sys

        print(warning, file=sys.stderr)
    config = repeat_config(config, n, registry)
    scorer = None
    if teacher is not None:
        from scaffold_core.teacher import Teacher, make_teacher

        # bad options fail here, before any model loads
        scorer = teacher if isinstance(teacher, Teacher) else make_teacher(teacher)
    changed = verifier_changes(config, Path(output_dir)) if resume and force_config and output_dir else {}
    rescored = rescore_saved(config, Path(output_dir), changed, registry) if changed and output_dir else None
    metrics, directory, tokenizer = run_answers(config, output_dir=output_dir, resume=resume, progress=progress,
                                                force_config=force_config, plugins=plugins, teacher=scorer)
    figures = compute_eval(directory, ks, select=select, registry=registry, bootstrap=bootstrap)
    figures.update(answers_per_problem=n, run={k: metrics.get(k) for k in (
        "episodes", "completed", "failed", "accuracy", "reward_mean", "generated_tokens", "truncated_fraction",
        "wall_s", "tokens_per_s")}, config=config.to_dict(), versions=versions(config.to_dict(), registry))
    if scorer is not None:
        described = dict(teacher) if isinstance(teacher, dict) else {"engine": type(teacher).__name__}
        figures["teacher"] = {"options": described, **scorer.stats.to_dict()}
    if rescored is not None:
        import sys

        print(rescored_message(changed, directory, rescored), file=sys.stderr)
        figures["rescored"] = {"changes": {key: {"saved": a, "now": b} for key, (a, b) in changed.items()},
                               **rescored.to_dict()}
    atomic_write_text(directory / EVAL_FILE, json.dumps(figures, indent=2) + "\n", private=config.output.private)
    return EvalResult(metrics, figures, directory, tokenizer)


def verifier_changes(config: Config, directory: Path) -> dict[str, tuple[Any, Any]]:
    """The ``verifier`` keys of ``config`` that differ from the config saved in ``directory`` (a resume)."""
    from scaffold_core.output.saved_config import config_changes

    saved = read_config(directory)
    if saved is None:
        return {}
    return {key: change for key, change in config_changes({"verifier": saved[1].get("verifier")},
                                                          {"verifier": config.to_dict().get("verifier")}).items()
            if key.startswith("verifier")}


def rescore_saved(config: Config, directory: Path, changed: dict[str, tuple[Any, Any]], registry: Any) -> Any:
    """Re-score the answers already in ``directory`` with ``config``'s verifier (``--force-config`` changed it),
    before the run goes on, so every answer and figure has one verifier (None: no saved answers)."""
    from scaffold_core.output.store import store_paths

    from .rescore import rescore_run

    if not store_paths(directory):
        return None
    verifier = registry.create("verifier", config.verifier.name, config.verifier.options, path="verifier")
    return rescore_run(directory, verifier, config.verifier.name, timeout=config.verifier_timeout,
                       workers=config.verifier_workers, private=config.output.private)


def rescored_message(changed: dict[str, tuple[Any, Any]], directory: Path, rescored: Any) -> str:
    """What re-scoring the saved answers did, in a few lines."""
    from scaffold_core.output.saved_config import describe

    lines = [f"scaffold: --force-config changed the verifier ({describe(changed)}): before going on, re-scored the "
             f"{rescored.samples:,} saved samples of {rescored.episodes:,} episodes in {directory} with "
             f"{rescored.verifier!r} ({rescored.changed:,} rewards changed; the responses are kept as they were, "
             "each sample's former verdict under previous_verdict), so every figure is the new verifier's; "
             "eval.json lists it under rescored"]
    if rescored.kept:
        lines.append(f"scaffold: {rescored.kept:,} runs' answers name no single sample (a vote's answer): they keep "
                     "their saved reward")
    if rescored.unscored:
        lines.append(f"scaffold: WARNING: {rescored.unscored:,} samples got no reward from {rescored.verifier!r}"
                     + (f" (first error: {rescored.errors[0]})" if rescored.errors else "")
                     + "; they count as unscored, never as 0")
    if rescored.advantages_stale:
        lines.append(f"scaffold: the {rescored.advantages_stale:,} training sequences whose reward changed keep the "
                     "advantage the saved rewards gave (a new run computes them from the new rewards)")
    return "\n".join(lines)


def format_table(figures: dict[str, Any]) -> str:
    """The figures as a text table: one row per k, each figure with its interval."""
    head = ["k", "problems", *figures.get("metrics", METRICS), "tokens/problem"]
    rows = [head]
    for entry in figures["by_k"]:
        cells = [str(entry["k"]), str(entry["problems"])]
        for name in [*figures.get("metrics", METRICS), "tokens_per_problem"]:
            fig = entry[name]
            value, ci = fig["value"], fig["ci"]
            digits = 0 if name == "tokens_per_problem" else 3
            text = "-" if value is None else f"{value:.{digits}f}"
            if ci is not None and value is not None:
                text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
            cells.append(text)
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    text = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
    kl = figures.get("teacher_kl")
    if kl:
        ci = f" [{kl['ci'][0]:.3f}, {kl['ci'][1]:.3f}]" if kl.get("ci") else ""
        text += (f"\nteacher-student KL (nats per token, mean over {kl['answers']} answers): {kl['value']:.3f}{ci}; "
                 f"per token {kl['per_token']:.3f}; largest answer {kl['max_answer']:.3f}")
    return text
