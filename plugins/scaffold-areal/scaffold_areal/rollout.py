"""What ``ScaffoldWorkflow.arun_episode`` does, free of any AReaL import (so it is testable without AReaL).

``arun_episode(engine, data)``: ``data`` (one dataset row) runs as one
scaffold episode of the configured controller on ``engine`` (through
:class:`~scaffold_areal.engine.ArealEngine`), with the core's
:class:`~scaffold_core.train.prompt_groups.TrainingRollouts` (the trainer owns the
engine: ``manage_engine=False``); it is scored by the configured verifier,
and comes back as AReaL's tensor dict
(:func:`scaffold_areal.padding.to_padded_tensor_dict`) with the
behaviour logprobs and the weight version of every token AReaL returned,
or ``None`` when it is rejected.

Rejection policy (``None`` excludes the episode from training, as AReaL
documents; every rejection is logged with its reason and counted in
:attr:`ScaffoldRollout.stats`):

* an episode that failed (engine error or timeout, verifier error, a
  controller bug, an unusable row) is rejected, never turned into a zero
  reward;
* ``reject_truncated=True`` drops samples cut by ``max_new_tokens``
  (finish reason ``length``);
* ``max_staleness=N`` applies the core's staleness policy when the episode
  ends: samples whose oldest generated token is more than N weight versions
  behind the engine are dropped (``on_stale="drop"``), or the episode runs
  again on the current weights (``on_stale="regenerate"``, at most twice);
* an episode left with no sample is rejected.

An episode with several samples (``majority_vote``, ``best_of_n``,
``native`` with ``samples: k``) returns all of them (``[k, L]``), or with
``samples="chosen"`` only the episode's answer (``[1, L]``).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any, ClassVar

from scaffold_areal.padding import to_padded_tensor_dict
from scaffold_core.run.assembly import Components, Limits
from scaffold_core.teacher import Teacher, make_teacher, score_samples
from scaffold_core.train.adapters import PromptTask, build_component, to_plain
from scaffold_core.train.prompt_groups import RolloutGroup, TrainingRollouts
from scaffold_core.train.staleness import StalenessPolicy
from scaffold_core.trajectory import TrainingSample

from .api import ArealAPI, as_gconfig
from .engine import ArealEngine, sampling_from_gconfig
from .samples import SAMPLES, ArealSamples

log = logging.getLogger("scaffold_areal")


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object from an object or a Hugging Face path (loaded as AReaL loads it, lazily)."""
    if tokenizer is None:
        raise ValueError("ScaffoldWorkflow needs tokenizer: pass workflow_kwargs=dict(tokenizer=config.tokenizer_path, "
                         "...) (prompts are rendered with its chat template)")
    if not isinstance(tokenizer, str):
        return tokenizer
    try:  # AReaL's own loader (it also sets a missing pad token to EOS)
        from areal.utils.hf_utils import load_hf_tokenizer
    except ImportError:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=True)
        if loaded.pad_token_id is None:
            loaded.pad_token_id = loaded.eos_token_id
        return loaded
    return load_hf_tokenizer(tokenizer)


class ScaffoldRollout:
    """Runs AReaL dataset rows as scaffold episodes; the logic of :class:`scaffold_areal.workflow.ScaffoldWorkflow`.

    Options (all picklable, so AReaL can build the workflow in its rollout
    workers from ``workflow_kwargs``):

    * ``controller``: a scaffold controller name, ``{name: ..., options...}``,
      or a controller object (default ``native``).
    * ``verifier``: a verifier name, ``{name: ..., options...}`` or object
      (required: AReaL needs a reward).
    * ``gconfig``: AReaL's ``GenerationHyperparameters`` (or a dict of its
      fields); every request's sampling (see :mod:`scaffold_areal.engine`).
    * ``tokenizer``: a Hugging Face tokenizer or its path.
    * ``task``: a scaffold task name or object whose ``messages(row)`` and
      ``reference(row)`` read the rows; by default a row is the prompt:
      ``messages_key`` (``"messages"``) holds the chat, ``reference_key``
      (``"answer"``, dotted paths allowed) the gold answer.
    * ``chat_template_kwargs``: extra chat template arguments (e.g.
      ``{"enable_thinking": False}``).
    * ``trajectory``: a scaffold trajectory maker (default ``single_turn``;
      ``multiturn`` for multi-turn controllers; it supplies each sample's
      reward).
    * ``samples``: ``"all"`` (default) or ``"chosen"``.
    * ``reject_truncated``, ``max_staleness``, ``on_stale``: the rejection
      policy above (``max_staleness``/``on_stale`` are the core's
      ``rollout.max_staleness``/``rollout.on_stale``).
    * ``turn_ids``: emit the ``turn_ids`` key (default: when the installed
      AReaL builds it, i.e. from 2.0 on).
    * ``request_timeout``, ``episode_timeout``, ``verifier_timeout``,
      ``retries``: bounds, as in ``scaffold run``'s ``rollout`` section.
    * ``teacher``: on-policy distillation: a teacher (the options of a
      config's ``teacher:``, e.g. ``{engine: vllm, url: ...}``, or a
      :class:`~scaffold_core.teacher.Teacher`) scores each accepted episode's
      samples (one batch per episode), which then carry ``teacher_logp``
      (see :mod:`scaffold_areal.padding`) for AReaL's distillation loss.
    """

    #: AReaL's classes; set by the concrete workflow class (the real AReaL, or a test's fake).
    areal: ClassVar[ArealAPI]

    def __init__(self, *, verifier: Any = None, controller: Any = "native", gconfig: Any = None,
                 tokenizer: Any = None, task: Any = None, messages_key: str = "messages",
                 reference_key: str | None = "answer", chat_template_kwargs: dict[str, Any] | None = None,
                 trajectory: Any = "single_turn", samples: str = "all", reject_truncated: bool = False,
                 max_staleness: int | None = None, on_stale: str = "drop", turn_ids: bool | None = None,
                 request_timeout: float = 3600.0, episode_timeout: float = 7200.0, verifier_timeout: float = 30.0,
                 retries: int = 0, teacher: Any = None):
        if verifier is None:
            raise ValueError("ScaffoldWorkflow needs a verifier (a scaffold verifier name such as 'gsm8k', or "
                             "{name: ..., options...}): AReaL trains on its rewards")
        if samples not in SAMPLES:
            raise ValueError(f"samples must be one of {SAMPLES}, got {samples!r}")
        self.staleness = StalenessPolicy(max_staleness, on_stale)
        # Episodes in flight are AReaL's to bound (``max_concurrent_rollouts``), not scaffold's.
        self.limits = Limits(concurrency=None, request_timeout=request_timeout, episode_timeout=episode_timeout,
                             verifier_timeout=verifier_timeout, retries=retries)
        self.gconfig = as_gconfig(self.areal, gconfig)
        self.tokenizer = load_tokenizer(tokenizer)
        if hasattr(self.gconfig, "new_with_stop_and_pad_token_ids"):  # as AReaL's RLVR workflow does
            self.gconfig = self.gconfig.new_with_stop_and_pad_token_ids(self.tokenizer)
        self.sampling = sampling_from_gconfig(self.gconfig)
        self.controller = build_component("controller", controller, path="controller")
        self.verifier = build_component("verifier", verifier, path="verifier")
        self.task = build_component("task", task, path="task") or PromptTask(
            messages_key, reference_key, to_plain(chat_template_kwargs))
        self.stats: Counter[str] = Counter()
        self.trajectory_maker = ArealSamples(
            build_component("trajectory_maker", trajectory, path="trajectory"), samples=samples,
            reject_truncated=reject_truncated, stats=self.stats)
        self.samples = samples
        self.reject_truncated = reject_truncated
        self.turn_ids = self.areal.turn_ids if turn_ids is None else turn_ids
        self._rollouts: dict[int, tuple[Any, TrainingRollouts]] = {}
        self.teacher = teacher if teacher is None or isinstance(teacher, Teacher) else make_teacher(to_plain(teacher))
        self._teacher_started = False

    def rollouts(self, engine: Any) -> TrainingRollouts:
        """The rollouts over AReaL engine ``engine`` (one per engine, built on first use; AReaL owns the engine)."""
        held = self._rollouts.get(id(engine))
        if held is None or held[0] is not engine:
            adapter = ArealEngine(engine, request_cls=self.areal.ModelRequest, gconfig=self.gconfig,
                                  tokenizer=self.tokenizer)
            components = Components(task=self.task, controller=self.controller, engine=adapter,
                                    verifier=self.verifier, trajectory_maker=self.trajectory_maker)
            held = (engine, TrainingRollouts(components, sampling=self.sampling, limits=self.limits,
                                             staleness=self.staleness, engine_name="areal", manage_engine=False))
            self._rollouts[id(engine)] = held
        return held[1]

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        """One row as one scaffold episode: AReaL's tensor dict, or None when the episode is rejected."""
        rollouts = self.rollouts(engine)
        await rollouts.start()
        row = dict(data)
        group = await rollouts.run_group(row, group_id=f"{row.get('id', 0)}-{uuid.uuid4().hex[:12]}")
        self.stats["episodes"] += 1
        samples = self.accepted(group)
        if samples is None:
            return None
        self.stats["samples"] += len(samples)
        if self.teacher is not None:
            if not self._teacher_started:
                await self.teacher.start()
                self._teacher_started = True
            await score_samples(self.teacher, samples)
        out = to_padded_tensor_dict(samples)
        if not self.turn_ids:
            del out["turn_ids"]
        return out

    def accepted(self, group: RolloutGroup) -> list[TrainingSample] | None:
        """The group's samples after the rejection policy (None: reject the episode)."""
        for key, count in (("dropped_stale", group.stale_dropped), ("regenerated_stale", group.regenerations)):
            if count:
                self.stats[key] += count
        if group.samples:
            return group.samples
        if group.failed:
            failed = group.failed[-1]
            self.stats["rejected_failed"] += 1
            log.warning("scaffold episode %s rejected: %s failed: %s", failed.episode_id, failed.error_component,
                        failed.error)
        else:
            self.stats["rejected_empty"] += 1
            log.warning("scaffold episode %s rejected: no sample left after the rejection policy (%s)",
                        group.group_id, dict(self.stats))
        return None

    async def aclose(self) -> None:
        """Release the controller's resources and the verifier pool (the rollout worker's end)."""
        held, self._rollouts = self._rollouts, {}
        for _, rollouts in held.values():
            await rollouts.close()
        if self.teacher is not None and self._teacher_started:
            self._teacher_started = False
            await self.teacher.close()
