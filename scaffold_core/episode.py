"""Per-episode data: the explicit context a controller receives, samples and results.

Nothing per-episode is ever written on shared objects: each episode gets its
own :class:`EpisodeContext` and its own controller clone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._cloning import copy_data
from .generation import GenerationTask
from .sampling import SamplingParams, mix_seed
from .verifier import Reference, Verdict


@dataclass(slots=True, eq=False)
class Sample:
    """One training sequence an episode produced.

    The sequence is ``prompt_ids + output_ids``. ``output_mask`` marks which
    output tokens the model generated (1) and which an environment inserted
    (0, multi-turn only); ``output_logprobs`` are the engine's behaviour
    logprobs (0.0 where the mask is 0). ``versions``, when known, has one
    entry per output id: the weight version that sampled it (-1 where the
    mask is 0); ``None`` means every generated token is ``weight_version``'s.
    ``text`` is the response the verifier scores.

    ``rollout`` says which rollout (one run of the policy on the prompt: one
    agent run; any number or text unique within the episode) of its episode
    the sample is a piece of. An agent whose client
    rewrote its history yields several samples from one run: they share one
    rollout number, one reward, count once in every metric (``reward_mean``,
    ``accuracy``, ``pass@k``) and share one advantage in training. ``None``
    (every built-in controller but the agent ones): the sample is a rollout of
    its own.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_mask: list[int]
    text: str
    finish_reason: str
    sample_index: int = 0
    weight_version: int | str | None = None
    verdict: Verdict | None = None
    turn_rewards: list[float] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    versions: list[int] | None = None
    rollout: int | str | None = None

    @classmethod
    def from_task(cls, task: GenerationTask) -> Sample:
        result = task.result
        if result is None:
            raise RuntimeError("cannot make a Sample from a GenerationTask that has not run")
        return cls(
            prompt_ids=task.prompt_ids,
            output_ids=result.output_ids,
            output_logprobs=result.logprobs,
            output_mask=[1] * len(result.output_ids),
            text=result.text,
            finish_reason=result.finish_reason,
            sample_index=task.sample_index,
            weight_version=result.weight_version,
            verdict=task.verdict,
            metadata=dict(task.metadata),
            versions=result.versions,
        )

    @property
    def reward(self) -> float | None:
        return None if self.verdict is None else self.verdict.reward

    @property
    def generated_tokens(self) -> int:
        mask = self.output_mask
        return mask.count(1) if type(mask) is list else sum(mask)  # a list of 0s and 1s: counted in C


def rollouts(samples: list[Any]) -> list[list[Any]]:
    """``samples`` grouped by rollout, in order of first appearance (a sample without one is a rollout of its own)."""
    groups: dict[Any, list[Any]] = {}
    for position, sample in enumerate(samples):
        key = getattr(sample, "rollout", None)
        groups.setdefault(("own", position) if key is None else key, []).append(sample)
    return list(groups.values())


@dataclass(slots=True, eq=False)
class Outcome:
    """What a controller's ``process`` generator returns.

    ``samples``: every training sequence of the episode (GenerationTasks are
    converted to :class:`Sample`). ``chosen``: index of the sample that is the
    episode's answer (best-of-n), or ``None``. ``answer``/``answer_reward``:
    the episode's final answer when it is not one sample's (a majority vote).
    ``metrics``: per-episode numbers such as ``{"maj@4": 1.0}``, averaged over
    the run. ``prompt``: the prompt the episode really used when it is not the
    task's rendered one (an agent that wrote its own), recorded as the
    episode's ``prompt``; ``None``: the task's.
    """

    samples: list[Any]
    chosen: int | None = None
    answer: str | None = None
    answer_reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    prompt: str | None = None


@dataclass(slots=True, eq=False)
class EpisodeContext:
    """Everything one episode needs, passed explicitly to its controller.

    ``row`` is the task row; ``prompt_ids`` the rendered prompt (read-only:
    tasks and samples share it; build a new list to extend it); ``reference``
    the gold answer (``None`` when the task has none); ``seed`` the episode's
    seed; ``messages`` the chat messages the prompt was rendered from.
    ``tokenizer`` is the engine's tokenizer (for multi-turn controllers).
    ``state`` is a scratch dict owned by this episode alone.
    """

    episode_id: str
    index: int
    row: dict[str, Any]
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    reference: Reference = None
    prompt_text: str = ""
    messages: list[dict[str, Any]] | None = None
    tokenizer: Any = None
    attempt: int = 0
    sample_base: int = 0
    state: dict[str, Any] = field(default_factory=dict)

    def branch(self, index: int) -> EpisodeContext:
        """A context for parallel branch ``index``: the same episode, its own copies of its mutable data.

        ``row``, ``messages`` and ``state`` are copied (deeply), so a branch
        that appends a message, edits the row or writes its state changes
        nothing its siblings or its parent see. Shared: the tokenizer (a
        handle), the immutable fields, and ``prompt_ids``, the rendered
        prompt, which every task and sample of the episode refers to and
        nothing may modify in place (a copy per branch would cost
        ``len(prompt) x branches`` per episode in flight); build a new list to
        extend it. Sample numbering starts at ``sample_base + index``.
        """
        try:
            state = copy_data(self.state) if self.state else {}
        except Exception as exc:
            raise ValueError(
                f"ctx.state holds something a parallel branch cannot copy ({type(exc).__name__}: {exc}); keep "
                "shared handles on the controller (named in its `shared` tuple), not in ctx.state") from exc
        return EpisodeContext(
            episode_id=self.episode_id, index=self.index, row=copy_data(self.row), prompt_ids=self.prompt_ids,
            sampling=self.sampling, seed=self.seed, reference=self.reference, prompt_text=self.prompt_text,
            messages=copy_data(self.messages), tokenizer=self.tokenizer, attempt=self.attempt,
            sample_base=self.sample_base + index, state=state,
        )

    def generation_task(
        self,
        sample_index: int = 0,
        *,
        prompt_ids: list[int] | None = None,
        sampling: SamplingParams | None = None,
        **metadata: Any,
    ) -> GenerationTask:
        """A generation task on this episode's prompt (or ``prompt_ids``).

        Each task gets its own seed, derived from the episode seed, the sample
        index and how many tasks this sample has had so far, so reruns with
        the same seed make the same requests.
        """
        sample_index += self.sample_base
        counts = self.state.setdefault("_task_counts", {})
        n = counts[sample_index] = counts.get(sample_index, 0) + 1
        return GenerationTask(
            prompt_ids=self.prompt_ids if prompt_ids is None else prompt_ids,
            sampling=sampling or self.sampling,
            sample_index=sample_index,
            seed=mix_seed(self.seed, sample_index, n),
            request_id=f"{self.episode_id}/{self.attempt}/{sample_index}/{n}",
            metadata=metadata,
        )


@dataclass(slots=True, eq=False)
class EpisodeResult:
    """A finished episode, ok or failed (never a silent zero reward).

    ``status`` is ``"ok"`` or ``"failed"``; a failed episode carries
    ``error`` (the reason) and ``error_component`` (engine, verifier,
    controller, trajectory, timeout, ...). ``spans``: where its time went
    (see :mod:`scaffold_core.spans`), seconds since the session's start, all
    finite (as :func:`scaffold_core.spans.relative` gives them), and
    ``started_s`` when it started on that clock; ``None`` when not recorded.
    """

    episode_id: str
    index: int
    status: str
    reference: Reference = None
    prompt_text: str = ""
    samples: list[Sample] = field(default_factory=list)
    chosen: int | None = None
    answer: str | None = None
    answer_reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    error_component: str | None = None
    attempts: int = 1
    wall_s: float = 0.0
    row: dict[str, Any] | None = None
    trajectories: list[Any] = field(default_factory=list)
    spans: list[list[Any]] | None = None
    started_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"
