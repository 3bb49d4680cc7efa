"""Re-score the answers already in a run's store with another verifier (``scaffold eval --resume --force-config``
with a changed verifier).

The answers are kept exactly as they were generated: responses, tokens,
logprobs, spans. Only what the verifier gave is recomputed, in the store
itself, so every figure derived from it afterwards (``eval.json``,
``metrics.json``, ``samples.jsonl``, the report) uses one verifier:

* each sample's ``extracted``, ``key``, ``reward``, ``reason`` and
  ``verdict_metrics``; the verdict it replaces is kept beside it, under
  ``previous_verdict``;
* each run's answer (``metadata.branch_answer`` of the ``repeat``
  controller): its ``extracted``, ``key`` and ``reward`` from the sample it
  names (an answer that names no sample, a vote's answer no single sample
  gave, keeps its saved reward and is counted in ``kept``); a vote is not
  counted again: the answer stays the one the run chose;
* the episode's ``answer_accuracy`` (the share of its runs' answers
  rewarded) and, when the episode chose a sample, its ``answer_reward``;
* the ``reward`` of each training sequence. Their ``advantage`` is left as
  the saved rewards gave it (how it is computed belongs to the trajectory
  maker), and a sequence whose sample now has no reward keeps its old one;
  ``advantages_stale`` counts the sequences either concerns.

A sample the verifier cannot score (an error or a timeout) gets no reward
(null, its reason says why), never a 0. Every store of the run is rewritten
in one transaction each, under the directory's lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaffold_core.errors import VerifierError
from scaffold_core.output import codec
from scaffold_core.output.lock import RunLock
from scaffold_core.output.store import connect, store_paths
from scaffold_core.verifier import Verdict

#: Samples verified in one call of the pool (a call that fails is retried one sample at a time).
CHUNK = 256


@dataclass
class Rescored:
    """What :func:`rescore_run` changed: counts of samples and answers, and the episodes it rewrote."""

    verifier: str
    episodes: int = 0
    samples: int = 0
    changed: int = 0  # samples whose reward is not the saved one
    unscored: int = 0  # samples the verifier gave no reward (an error, a timeout, or an unscored verdict)
    answers: int = 0  # runs' answers re-scored
    kept: int = 0  # runs' answers that name no sample: their saved reward is kept
    advantages_stale: int = 0  # training sequences whose reward changed (their advantage was not recomputed)
    errors: list[str] = field(default_factory=list)  # the first few verifier errors

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "errors"}
        if self.errors:
            out["errors"] = list(self.errors)
        return out


def rescore_run(directory: Path, verifier: Any, name: str, *, timeout: float = 30.0, workers: int = 2,
                private: bool = True) -> Rescored:
    """Re-score every completed episode's samples in the stores of ``directory`` with ``verifier`` (see the
    module's docstring); holds the directory's lock meanwhile."""
    from scaffold_core.run.verifier_pool import VerifierPool

    summary = Rescored(verifier=name)
    with RunLock(Path(directory), private=private):
        pool = VerifierPool(verifier, timeout=timeout, workers=workers, name=name)
        try:
            for path in store_paths(directory):
                _rescore_store(path, pool, summary, private)
        finally:
            pool.close()
    return summary


def _rescore_store(path: Path, pool: Any, summary: Rescored, private: bool) -> None:
    db = connect(path, private=private)
    try:
        found = db.execute("SELECT episode_id, CAST(head AS BLOB), CAST(rows AS BLOB) FROM episodes "
                           "WHERE status = 'ok' ORDER BY idx, episode_id").fetchall()
        records = [(eid, codec.loads(head), codec.loads(rows) if rows else None) for eid, head, rows in found]
        items = [(str(s.get("response") or ""), head.get("answer"))
                 for _, head, _ in records for s in head.get("samples") or [] if isinstance(s, dict)]
        verdicts = asyncio.run(_verify(pool, items, summary))
        updates = []
        at = 0
        for eid, head, rows in records:
            samples = [s for s in head.get("samples") or [] if isinstance(s, dict)]
            rewards = _apply(head, samples, verdicts[at:at + len(samples)], summary)
            at += len(samples)
            if rows:
                for fields, _columns in rows:
                    index = fields.get("sample_index")
                    if index not in rewards or rewards[index] == fields.get("reward"):
                        continue
                    summary.advantages_stale += 1
                    if rewards[index] is not None:  # a sequence whose sample lost its reward keeps the old one
                        fields["reward"] = rewards[index]
            summary.episodes += 1
            updates.append((codec.dumps_compact(head), codec.dumps_compact(rows) if rows else None, eid))
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("UPDATE episodes SET head = CAST(? AS TEXT), rows = CAST(? AS TEXT) WHERE episode_id = ?",
                           updates)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()


async def _verify(pool: Any, items: list[tuple[str, Any]], summary: Rescored) -> list[Verdict | None]:
    """A verdict per item, None for one the verifier could not score (its error kept in ``summary``)."""
    out: list[Verdict | None] = []
    for start in range(0, len(items), CHUNK):
        chunk = items[start:start + CHUNK]
        try:
            out.extend(await pool.verify_many(chunk))
            continue
        except VerifierError:
            pass
        for item in chunk:  # one of the chunk failed: each alone, so the others still count
            try:
                out.extend(await pool.verify_many([item]))
            except VerifierError as exc:
                if len(summary.errors) < 5:
                    summary.errors.append(str(exc))
                out.append(None)
    return out


def _apply(head: dict[str, Any], samples: list[dict[str, Any]], verdicts: list[Verdict | None],
           summary: Rescored) -> dict[Any, float | None]:
    """Write the new verdicts into one episode's head; returns {sample index: new reward (None: none)}."""
    rewards: dict[Any, float | None] = {}
    by_index: dict[Any, dict[str, Any]] = {}
    for sample, verdict in zip(samples, verdicts):
        old = {k: sample.get(k) for k in ("reward", "extracted", "key", "reason")}
        if sample.get("verdict_metrics"):
            old["verdict_metrics"] = sample["verdict_metrics"]
        sample["previous_verdict"] = old
        sample.pop("verdict_metrics", None)
        if verdict is None:
            sample.update(reward=None, extracted=None, key=None, reason="the verifier could not score it")
        else:
            scored = verdict.scored and verdict.reward == verdict.reward  # NaN: no reward
            sample.update(reward=float(verdict.reward) if scored else None, extracted=verdict.extracted,
                          key=verdict.key, reason=verdict.reason)
            if verdict.metrics:
                sample["verdict_metrics"] = dict(verdict.metrics)
        summary.samples += 1
        summary.unscored += sample["reward"] is None
        rewards[sample.get("sample_index")] = sample["reward"]
        if sample["reward"] != old["reward"]:
            summary.changed += 1
        by_index[sample.get("sample_index")] = sample
    correct: list[float] = []
    branched = False
    for sample in samples:
        answer = (sample.get("metadata") or {}).get("branch_answer")
        if not isinstance(answer, dict):
            continue
        branched = True
        named = by_index.get(answer.get("sample")) if answer.get("sample") is not None else None
        if named is None:
            summary.kept += 1
        else:
            key = named.get("key")
            answer.update(extracted=named.get("extracted"), key=key if key is not None else named.get("extracted"),
                          reward=named.get("reward"))
            summary.answers += 1
        if isinstance(answer.get("reward"), (int, float)):
            correct.append(float(answer["reward"] > 0))
    metrics = head.get("metrics")
    if branched and isinstance(metrics, dict) and "answer_accuracy" in metrics:
        if correct:
            metrics["answer_accuracy"] = sum(correct) / len(correct)
        else:
            metrics.pop("answer_accuracy")
    chosen = head.get("chosen")
    if isinstance(chosen, int) and not isinstance(chosen, bool) and 0 <= chosen < len(samples):
        head["answer_reward"] = samples[chosen].get("reward")
    return rewards
