"""The episodes side of a report: statistics over every episode, and the sample the browser shows in full.

:func:`scan` reads every episode's head once (no token lists) for the counts
and distributions the charts show. :func:`choose` picks the episodes the
trajectory browser carries whole: all of them up to a bound, past it a
stratified random sample (by status and by how the episode's answers were
rewarded, seeded), so a large run still gives a page of a few megabytes.
:func:`episode_detail` turns one whole record into the page's compact form:
token ids with one shared table of their texts, logprobs in hundredths,
loss mask and versions as runs, and the episode's spans (where its time went:
queued, prefill, decode, generate, verify, tool calls, weight-update waits)
relative to its start, with each phase's share.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from .eval.answers import answers_of, usable_number
from .timeline import TRACE_EPISODES, Timeline

#: Episodes the browser carries in full at most, and the page bytes their tokens may take (estimated).
MAX_EPISODES = 300
DETAIL_BYTES = 6_000_000
#: Page bytes per generated token (id, logprob) and per sample besides its tokens, for the estimate.
BYTES_PER_TOKEN = 8
BYTES_PER_SAMPLE = 160
#: Spans the browser lists per episode at most (an agent's episode may hold thousands of tool calls).
MAX_SPANS = 400
#: Page bytes per span listed (phase, start, end).
BYTES_PER_SPAN = 30


def _reward(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


#: The strata of :func:`choose`, by their code in :class:`Strata`.
STRATA = ("failed", "unscored", "none", "all", "some")
_STRATUM = {kind: code for code, kind in enumerate(STRATA)}


class Strata:
    """(position, stratum, estimated page bytes) per episode, kept as three arrays (about 17 bytes an
    episode, against 130 as tuples in a list: a run of a million episodes counts them all). Iterates as
    those tuples."""

    __slots__ = ("positions", "kinds", "sizes")

    def __init__(self) -> None:
        self.positions = array("q")
        self.kinds = array("b")
        self.sizes = array("q")

    def add(self, position: int, kind: str, size: int) -> None:
        self.positions.append(position)
        self.kinds.append(_STRATUM[kind])
        self.sizes.append(size)

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[tuple[int, str, int]]:
        return zip(self.positions, map(STRATA.__getitem__, self.kinds), self.sizes)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (Strata, list)) else NotImplemented


@dataclass
class Stats:
    """What every episode's head contributes to the charts and the summary."""

    episodes: int = 0
    failed: int = 0
    samples: int = 0
    unscored: int = 0
    rewards: array[float] = field(default_factory=lambda: array("d"))  # arrays: a value takes 8 bytes, not 32
    tokens: array[int] = field(default_factory=lambda: array("q"))
    finish: Counter[str] = field(default_factory=Counter)
    solved: Counter[tuple[int, int]] = field(default_factory=Counter)  # (correct answers, answers) per episode
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    strata: Strata = field(default_factory=Strata)  # (position, stratum, estimated bytes)
    timeline: Timeline = field(default_factory=Timeline)  # where the episodes' time went (bounded)

    def add(self, position: int, head: dict[str, Any]) -> None:
        """Count one episode's head (``position``: its place in the order the browser numbers episodes)."""
        self.episodes += 1
        if "spans" in head:
            self.timeline.add(head)
        if head.get("status") != "ok":
            self.failed += 1
            first = (str(head.get("error") or "no reason given").strip().splitlines() or [""])[0][:200]
            self.failures[(str(head.get("error_component") or "episode"), first)] += 1
            self.strata.add(position, "failed", 400 + len(str(head.get("error") or "")))
            return
        spans = head.get("spans")
        size = len(head.get("prompt") or "") + 200 + BYTES_PER_SPAN * min(len(spans) if isinstance(spans, list)
                                                                           else 0, MAX_SPANS)
        scored = correct = 0  # of the samples, each its own answer unless they carry runs (see answers_of)
        branched = False
        for sample in head.get("samples") or []:
            self.samples += 1
            value = usable_number(sample.get("reward"))  # as answers_of reads it: an infinity is scored
            if value is not None:
                scored += 1
                correct += value > 0
            if value is None or not math.isfinite(value):  # what _reward leaves out
                self.unscored += 1
            else:
                self.rewards.append(value)
            tokens = int(sample.get("generated_tokens") or 0)
            self.tokens.append(tokens)
            self.finish[str(sample.get("finish_reason") or "?")] += 1
            size += BYTES_PER_SAMPLE + BYTES_PER_TOKEN * tokens
            metadata = sample.get("metadata")
            if isinstance(metadata, dict) and isinstance(metadata.get("branch"), int):
                branched = True
        if branched:  # the runs of a repeat controller are the answers
            answers = [a for a in answers_of(head) if a.reward is not None]
            scored, correct = len(answers), sum(1 for a in answers if a.correct)
        if scored:
            self.solved[(correct, scored)] += 1
        kind = "unscored" if not scored else "none" if not correct else "all" if correct == scored else "some"
        self.strata.add(position, kind, size)


def scan(heads: Any, trace_episodes: int = TRACE_EPISODES) -> Stats:
    """Counts and distributions over every episode head (in the order the browser numbers them);
    ``trace_episodes``: the episodes the timeline keeps whole for ``trace.json``."""
    stats = Stats(timeline=Timeline(keep=trace_episodes))
    for position, head in enumerate(heads):
        stats.add(position, head)
    return stats


class _Strata(Protocol):
    """What :func:`choose` reads: a :class:`Strata`, or a list of its tuples."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[int, str, int]]: ...


def choose(strata: _Strata, max_episodes: int = MAX_EPISODES, budget: int = DETAIL_BYTES,
           seed: int = 0) -> list[int]:
    """Positions of the episodes the browser carries: all when they fit, else a stratified random sample.

    The bound is ``max_episodes`` and the estimated ``budget`` bytes, whichever is smaller. Each stratum
    (failed; answers all right, some right, none right, unscored) gets a share proportional to its size,
    and at least a few episodes when it has them, so rare failures still show.
    """
    if not strata or max_episodes <= 0:
        return []
    mean = sum(size for _, _, size in strata) / len(strata)
    cap = max(1, min(max_episodes, int(budget / max(mean, 1.0))))
    if len(strata) <= cap:
        return [p for p, _, _ in strata]
    groups: dict[str, list[int]] = {}
    for position, kind, _ in strata:
        groups.setdefault(kind, []).append(position)
    floor = max(1, cap // (4 * len(groups)))
    quota = {kind: min(len(g), max(floor, round(cap * len(g) / len(strata)))) for kind, g in groups.items()}
    while sum(quota.values()) > cap:  # trim the largest share first
        largest = max(quota, key=lambda kind: quota[kind])
        quota[largest] -= 1
    rng = random.Random(seed)
    chosen = [p for kind, g in sorted(groups.items()) for p in rng.sample(g, quota[kind])]
    return sorted(chosen)


class Vocab:
    """The distinct token ids the page's episodes use (their texts go in one shared table, keyed by id)."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def add(self, ids: list[int]) -> list[int]:
        self.ids.update(ids)
        return ids

    def table(self, texts: dict[int, str]) -> dict[str, str]:
        """id (as a string: a JSON key) -> its token text, for the ids that have one."""
        return {str(token): texts[token] for token in self.ids if token in texts}


def _centi(values: list[Any]) -> list[int]:
    """Logprobs in hundredths of a nat, as integers (0 for anything that is not a finite number)."""
    import numpy as np

    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return [round(v * 100) if isinstance(v, (int, float)) and math.isfinite(v) else 0 for v in values]
    return np.rint(np.nan_to_num(array * 100, nan=0.0, posinf=0.0, neginf=0.0)).astype(np.int64).tolist()


def _runs(values: list[int]) -> list[int]:
    """[value, length, value, length, ...] of consecutive equal values."""
    if values and values.count(values[0]) == len(values):  # the common case: one run (C speed)
        return [values[0], len(values)]
    out: list[int] = []
    for value in values:
        if out and out[-2] == value:
            out[-1] += 1
        else:
            out.extend((value, 1))
    return out


def episode_detail(record: dict[str, Any], vocab: Vocab) -> dict[str, Any]:
    """One whole episode record in the page's compact form (see the module's docstring)."""
    out: dict[str, Any] = {"id": record.get("episode_id"), "i": record.get("index"), "st": record.get("status"),
                           "p": record.get("prompt") or "", "ref": record.get("answer"),
                           "fa": record.get("final_answer"), "ar": record.get("answer_reward"),
                           "att": record.get("attempts"), "w": record.get("wall_s")}
    timing = episode_spans(record)
    if timing:
        out["sp"] = timing
    if record.get("status") != "ok":
        out.update(err=record.get("error"), ec=record.get("error_component"))
        return out
    rows = {t.get("sample_index"): t for t in record.get("trajectories") or [] if isinstance(t, dict)}
    out["s"] = [_sample(s, rows.get(s.get("sample_index")), vocab) for s in record.get("samples") or []]
    return out


def episode_spans(record: dict[str, Any], limit: int = MAX_SPANS) -> dict[str, Any] | None:
    """Where one episode's time went, for the browser: its spans as ``[phase, start, end]`` (``+ [name]``) in
    seconds since the episode's start (the first ``limit``; ``more``: how many were left out), and each phase's
    share of its time (``parts``: seconds, divided as the report's Time section divides them); None when it
    recorded none."""
    from scaffold_core.spans import exclusive

    spans = record.get("spans")
    if not isinstance(spans, list) or not spans:
        return None
    try:
        items = [(str(s[0]), float(s[1]), float(s[2]), str(s[3]) if len(s) > 3 and s[3] else "") for s in spans]
    except (TypeError, ValueError, IndexError):  # a span that is no (phase, start, end): nothing to draw
        return None
    started = record.get("started_s")
    first = min(s[1] for s in items)
    started = float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else first
    began = min(started, first)  # a queued span starts before the episode does
    wall = record.get("wall_s")
    ended = max(started + (float(wall) if isinstance(wall, (int, float)) else 0.0), max(s[2] for s in items))
    parts = exclusive(sorted(items, key=lambda s: s[1]), began, ended)
    shown = [[phase, round(a - began, 4), round(b - began, 4), *([name] if name else [])]
             for phase, a, b, name in items[:limit]]
    out: dict[str, Any] = {"d": round(ended - began, 4), "s": shown,
                           "parts": {p: round(v, 4) for p, v in parts.items() if v > 0}}
    if len(items) > limit:
        out["more"] = len(items) - limit
    return out


def _sample(sample: dict[str, Any], row: dict[str, Any] | None, vocab: Vocab) -> dict[str, Any]:
    meta = sample.get("metadata") or {}
    out: dict[str, Any] = {"si": sample.get("sample_index"), "r": _reward(sample.get("reward")),
                           "x": sample.get("extracted"), "k": sample.get("key"), "why": sample.get("reason"),
                           "f": sample.get("finish_reason"), "g": sample.get("generated_tokens"),
                           "b": meta.get("branch"), "v": sample.get("weight_version"), "end": meta.get("end")}
    answer = meta.get("branch_answer")
    if isinstance(answer, dict):
        out["ba"] = {"x": answer.get("extracted"), "r": _reward(answer.get("reward")), "s": answer.get("sample")}
    if row is None or not isinstance(row.get("input_ids"), list):
        out["txt"] = sample.get("response") or ""
        return out
    if "step" in row:  # a training run's sample: its step, GRPO group, advantage, and whether it was trained on
        out.update(st=row.get("step"), gid=row.get("group_id"), adv=row.get("advantage"), u=row.get("used"))
    start = int(row.get("prompt_len") or 0)
    ids = row["input_ids"][start:]
    out["t"] = vocab.add(ids)
    out["lp"] = _centi((row.get("logprobs") or [])[start:])
    out["m"] = _runs(list((row.get("loss_mask") or [])[start:]))
    out["ver"] = _runs(list((row.get("versions") or [])[start:]))
    teacher = row.get("teacher_logprobs")
    if isinstance(teacher, list) and len(teacher) == len(row["input_ids"]):  # on-policy distillation
        out["tlp"] = _centi(teacher[start:])
        gen = [(b, t) for b, t, m in zip(row.get("logprobs") or [], teacher, row.get("loss_mask") or []) if m]
        if gen:
            out["kl"] = round(sum(b - t for b, t in gen) / len(gen), 4)
    turns = [[t["start"] - start, t["end"] - start, t.get("index")] for t in meta.get("turns") or []
             if isinstance(t, dict) and isinstance(t.get("start"), int) and isinstance(t.get("end"), int)]
    if turns:
        out["tu"] = turns
    calls = [c for c in meta.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        out["tc"] = [{"turn": c.get("turn"), "n": c.get("name"), "a": c.get("arguments"), "ok": c.get("ok"),
                      "e": c.get("error")} for c in calls]
    return out
