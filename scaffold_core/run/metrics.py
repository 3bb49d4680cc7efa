"""Run metrics, accumulated as episodes finish (O(1) memory per run). What each figure means is defined in
docs/runtime.md ("The figures of metrics.json").
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from typing import Any

from ..episode import EpisodeResult, rollouts
from ..spans import exclusive
from ..trajectory import usable_reward

TRUNCATION_WARNING = 0.2
#: Distinct failure causes counted per run (more are counted under their component only).
MAX_CAUSES = 256
#: Causes listed in the metrics' ``top_failure_causes``.
TOP_CAUSES = 5


def failure_message(error: str | None) -> str:
    """The first line of an episode's error, shortened."""
    first = (error or "").strip().splitlines()[0] if (error or "").strip() else "no reason given"
    return first if len(first) <= 200 else first[:197] + "..."


def failure_cause(error: str | None, episode_id: str = "") -> str:
    """What failures with the same cause share: the first line of the error with the episode's id and
    every number blanked (request ids, attempts and sizes differ from one episode to the next)."""
    first = failure_message(error)
    if episode_id:
        first = first.replace(episode_id, "<episode>")
    return re.sub(r"\d+", "#", first)


def episode_correct(result: EpisodeResult) -> float | None:
    """Whether the episode's answer is correct (1.0/0.0, or a fraction of its samples); None when unscored."""
    if result.chosen is not None and 0 <= result.chosen < len(result.samples):
        reward = usable_reward(result.samples[result.chosen])
        return None if reward is None else float(reward > 0)
    if result.answer_reward is not None:
        return None if math.isnan(result.answer_reward) else float(result.answer_reward > 0)
    rewards = [r for r in map(rollout_reward, rollouts(result.samples)) if r is not None]
    if not rewards:
        return None
    return sum(1.0 for r in rewards if r > 0) / len(rewards)


def rollout_reward(samples: list[Any]) -> float | None:
    """The reward of one rollout: its samples' (they share one; the mean if they differ), None when unscored."""
    rewards = [r for r in map(usable_reward, samples) if r is not None]
    return sum(rewards) / len(rewards) if rewards else None


class RunMetrics:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.episodes = 0
        self.completed = 0
        self.failed = 0
        self.failures: Counter[str] = Counter()
        self.failure_examples: dict[str, str] = {}
        self.failure_causes: Counter[tuple[str, str]] = Counter()
        self.cause_examples: dict[tuple[str, str], str] = {}
        self.samples = 0
        self.unscored = 0
        self.rollouts = 0
        self.scored_rollouts = 0
        self.reward_sum = 0.0
        self.correct_sum = 0.0
        self.scored_episodes = 0
        self.generated_tokens = 0
        self.truncated = 0
        self.retried = 0
        self.extra_sum: dict[str, float] = defaultdict(float)
        self.extra_n: Counter[str] = Counter()
        self.skipped_rows: Counter[str] = Counter()
        self.resumed = 0
        self.phase_s: dict[str, float] = defaultdict(float)  # episode time by phase (scaffold_core.spans)
        self.spanned_s = 0.0  # the time of the episodes that recorded spans

    def restart_clock(self) -> None:
        self.start = time.perf_counter()

    def add(self, result: EpisodeResult) -> None:
        self.episodes += 1
        self.retried += max(0, result.attempts - 1)
        if result.spans is not None:
            self._add_spans(result)
        if not result.ok:
            self.failed += 1
            key = result.error_component or "episode"
            self.failures[key] += 1
            self.failure_examples.setdefault(key, result.error or "")
            cause = (key, failure_cause(result.error, result.episode_id))
            if cause in self.failure_causes or len(self.failure_causes) < MAX_CAUSES:
                self.failure_causes[cause] += 1
                self.cause_examples.setdefault(cause, failure_message(result.error))
            return
        self.completed += 1
        correct = episode_correct(result)
        if correct is not None:
            self.correct_sum += correct
            self.scored_episodes += 1
        for sample in result.samples:
            self.samples += 1
            if usable_reward(sample) is None:
                self.unscored += 1
            self.generated_tokens += sample.generated_tokens
            if sample.finish_reason == "length":
                self.truncated += 1
        any_scored = any_correct = False
        runs = rollouts(result.samples) if any(s.rollout is not None for s in result.samples) else \
            [[s] for s in result.samples]
        for run in runs:
            self.rollouts += 1
            reward = rollout_reward(run)
            if reward is not None:
                any_scored = True
                any_correct = any_correct or reward > 0
                self.reward_sum += reward
                self.scored_rollouts += 1
        k = len(runs)
        if k > 1 and any_scored:
            name = f"pass@{k}"
            self.extra_sum[name] += float(any_correct)
            self.extra_n[name] += 1
        for name, value in result.metrics.items():
            self.extra_sum[name] += float(value)
            self.extra_n[name] += 1

    def _add_spans(self, result: EpisodeResult) -> None:
        """The episode's time, from its first span (a wait for its turn) to its end, divided among phases."""
        spans = result.spans or []
        started = result.started_s or 0.0
        begin = spans[0][1] if spans and spans[0][1] < started else started  # spans are in order of their start
        end = started + result.wall_s
        if end <= begin:
            return
        self.spanned_s += end - begin
        phase_s = self.phase_s
        for phase, seconds in exclusive(spans, begin, end).items():
            phase_s[phase] += seconds

    def time_shares(self) -> dict[str, float]:
        """Each phase's share of the episodes' time (those that recorded spans), largest first."""
        total = self.spanned_s
        if total <= 0:
            return {}
        return {phase: round(seconds / total, 4)
                for phase, seconds in sorted(self.phase_s.items(), key=lambda item: -item[1])}

    #: The totals :meth:`state` carries (counts and sums; a session's clock and skipped rows are not totals).
    _SUMS = ("episodes", "completed", "failed", "samples", "unscored", "rollouts", "scored_rollouts", "reward_sum",
             "correct_sum", "scored_episodes", "generated_tokens", "truncated", "retried")

    def state(self) -> dict[str, Any]:
        """The totals of the episodes added, as JSON, for another process to combine (:meth:`from_states`)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self._SUMS}
        out["failures"] = list(self.failures.items())
        out["failure_examples"] = list(self.failure_examples.items())
        out["failure_causes"] = [[*cause, n] for cause, n in self.failure_causes.items()]
        out["cause_examples"] = [[*cause, text] for cause, text in self.cause_examples.items()]
        out["extra"] = [[name, self.extra_sum[name], self.extra_n[name]] for name in self.extra_sum]
        out["phases"] = [self.spanned_s, sorted(self.phase_s.items())]
        return out

    @classmethod
    def from_states(cls, states: list[dict[str, Any]]) -> RunMetrics:
        """The totals of several sets of episodes, as if their episodes had been added in this order."""
        out = cls()
        for state in states:
            if "rollouts" not in state:  # saved before rollouts were counted: every sample was one
                state = {**state, "rollouts": state["samples"], "scored_rollouts": state["samples"] - state["unscored"]}
            for name in cls._SUMS:
                setattr(out, name, getattr(out, name) + state[name])
            for key, n in state["failures"]:
                out.failures[key] += n
            for key, text in state["failure_examples"]:
                out.failure_examples.setdefault(key, text)
            for component, cause, n in state["failure_causes"]:
                if (component, cause) in out.failure_causes or len(out.failure_causes) < MAX_CAUSES:
                    out.failure_causes[(component, cause)] += n
            for component, cause, text in state["cause_examples"]:
                if (component, cause) in out.failure_causes:
                    out.cause_examples.setdefault((component, cause), text)
            for name, total, n in state["extra"]:
                out.extra_sum[name] += total
                out.extra_n[name] += n
            spanned, phases = state.get("phases") or (0.0, [])
            out.spanned_s += spanned
            for phase, seconds in phases:
                out.phase_s[phase] += seconds
        return out

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.start

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.scored_rollouts if self.scored_rollouts else 0.0

    @property
    def tokens_per_s(self) -> float:
        wall = self.wall_s
        return self.generated_tokens / wall if wall > 0 else 0.0

    @property
    def truncated_fraction(self) -> float:
        return self.truncated / self.samples if self.samples else 0.0

    def summary(self, **extra: Any) -> dict[str, Any]:
        wall = self.wall_s
        out: dict[str, Any] = {
            "episodes": self.episodes,
            "completed": self.completed,
            "failed": self.failed,
            "failures": dict(self.failures),
            "failure_examples": dict(self.failure_examples),
            "top_failure_causes": [{"component": cause[0], "error": self.cause_examples[cause], "count": count}
                                   for cause, count in self.failure_causes.most_common(TOP_CAUSES)],
            "samples": self.samples,
            "unscored_samples": self.unscored,
            "rollouts": self.rollouts,
            "reward_mean": round(self.reward_mean, 6),
            "accuracy": round(self.correct_sum / self.scored_episodes, 6) if self.scored_episodes else 0.0,
            "generated_tokens": self.generated_tokens,
            "tokens_per_s": round(self.generated_tokens / wall, 3) if wall > 0 else 0.0,
            "episodes_per_s": round(self.episodes / wall, 3) if wall > 0 else 0.0,
            "wall_s": round(wall, 3),
            "truncated_fraction": round(self.truncated_fraction, 6),
            "retried_attempts": self.retried,
        }
        for name in sorted(self.extra_sum):
            out[name] = round(self.extra_sum[name] / self.extra_n[name], 6)
        if self.skipped_rows:
            out["skipped_rows"] = dict(self.skipped_rows)
        if self.spanned_s > 0:
            out["episode_time_s"] = round(self.spanned_s, 3)
            out["time_shares"] = self.time_shares()
        out.update(extra)
        return out

def unscored_warning(metrics: dict[str, Any]) -> str | None:
    """The message for runs where some samples have no reward, else None."""
    unscored = metrics.get("unscored_samples") or 0
    if not unscored:
        return None
    return (f"scaffold: {unscored} of {metrics.get('samples', '?')} sample(s) have no reward (not verified, or the "
            "verifier could not score them). They are not counted as 0: they are left out of reward_mean and "
            "accuracy, and out of the training data unless trajectory.missing_reward is fail (then their "
            "episodes failed)")


def truncation_warning(fraction: float) -> str | None:
    """The loud message for runs where too many responses hit max_tokens, else None."""
    if fraction <= TRUNCATION_WARNING:
        return None
    return (
        f"WARNING: {fraction:.0%} of responses stopped because they hit max_tokens. Their rewards are usually 0.\n"
        "Raise sampling.max_tokens (e.g. --set sampling.max_tokens=1024) unless this is intended."
    )
