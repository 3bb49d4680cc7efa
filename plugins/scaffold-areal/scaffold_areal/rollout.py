"""What ``ScaffoldWorkflow.arun_episode`` does, free of any AReaL import (so it is testable without AReaL).

``arun_episode(engine, data)``: ``data`` (one dataset row) runs as one
scaffold episode of the configured controller on ``engine`` (through
:class:`~scaffold_areal.engine.ArealEngine`), is scored by the configured
verifier, and comes back as AReaL's tensor dict
(:mod:`scaffold_areal.tensors`) with the behaviour logprobs AReaL returned and
the weight version of every token, or ``None`` when it is rejected.

Rejection policy (``None`` excludes the episode from training, as AReaL
documents; every rejection is logged with its reason and counted in
:attr:`ScaffoldRollout.stats`):

* an episode that failed (engine error or timeout, verifier error, a
  controller bug, an unusable row) is rejected, never turned into a zero
  reward;
* ``reject_truncated=True`` drops samples cut by ``max_new_tokens``
  (finish reason ``length``);
* ``max_staleness=N`` drops samples whose oldest generated token is more
  than N weight versions behind the engine's version at hand-over;
* an episode left with no sample is rejected.

An episode with several samples (``majority_vote``, ``best_of_n``,
``native`` with ``samples: k``) returns all of them (``[k, L]``), or with
``samples="chosen"`` only the episode's answer (``[1, L]``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, ClassVar

from scaffold_core.episode import EpisodeResult

from ._episodes import EpisodeRunner, PromptTask, build_component, to_plain
from .api import ArealAPI, as_gconfig
from .engine import ArealEngine, sampling_from_gconfig
from .tensors import TokenRow, tensor_dict
from .versions import EpisodeVersions, VersionLedger

log = logging.getLogger("scaffold_areal")

SAMPLES = ("all", "chosen")


def chosen_index(episode: EpisodeResult) -> int:
    """The episode's answer among its samples: ``chosen``, else the first sample carrying the voted answer, else 0."""
    if episode.chosen is not None:
        return episode.chosen
    if episode.answer is not None:
        for i, sample in enumerate(episode.samples):
            if sample.verdict is not None and episode.answer in (sample.verdict.extracted, sample.verdict.key):
                return i
    return 0


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
    * ``reject_truncated``, ``max_staleness``: the rejection policy above.
    * ``turn_ids``: emit the ``turn_ids`` key (default: when the installed
      AReaL builds it, i.e. from 2.0 on).
    * ``request_timeout``, ``episode_timeout``, ``verifier_timeout``,
      ``retries``: bounds, as in ``scaffold run``'s ``rollout`` section.
    """

    #: AReaL's classes; set by the concrete workflow class (the real AReaL, or a test's fake).
    areal: ClassVar[ArealAPI]

    def __init__(self, *, verifier: Any = None, controller: Any = "native", gconfig: Any = None,
                 tokenizer: Any = None, task: Any = None, messages_key: str = "messages",
                 reference_key: str | None = "answer", chat_template_kwargs: dict[str, Any] | None = None,
                 trajectory: Any = "single_turn", samples: str = "all", reject_truncated: bool = False,
                 max_staleness: int | None = None, turn_ids: bool | None = None, request_timeout: float = 3600.0,
                 episode_timeout: float = 7200.0, verifier_timeout: float = 30.0, retries: int = 0):
        if verifier is None:
            raise ValueError("ScaffoldWorkflow needs a verifier (a scaffold verifier name such as 'gsm8k', or "
                             "{name: ..., options...}): AReaL trains on its rewards")
        if samples not in SAMPLES:
            raise ValueError(f"samples must be one of {SAMPLES}, got {samples!r}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.gconfig = as_gconfig(self.areal, gconfig)
        self.tokenizer = load_tokenizer(tokenizer)
        if hasattr(self.gconfig, "new_with_stop_and_pad_token_ids"):  # as AReaL's RLVR workflow does
            self.gconfig = self.gconfig.new_with_stop_and_pad_token_ids(self.tokenizer)
        self.sampling = sampling_from_gconfig(self.gconfig)
        self.controller = build_component("controller", controller, path="controller")
        self.verifier = build_component("verifier", verifier, path="verifier")
        self.trajectory_maker = build_component("trajectory_maker", trajectory, path="trajectory")
        self.task = build_component("task", task, path="task") or PromptTask(
            messages_key, reference_key, to_plain(chat_template_kwargs))
        self.samples = samples
        self.reject_truncated = reject_truncated
        self.max_staleness = max_staleness
        self.turn_ids = self.areal.turn_ids if turn_ids is None else turn_ids
        self.limits: dict[str, Any] = dict(request_timeout=request_timeout, episode_timeout=episode_timeout,
                           verifier_timeout=verifier_timeout, retries=retries)
        self.ledger = VersionLedger()
        self.stats: Counter[str] = Counter()
        self._runners: dict[int, tuple[Any, EpisodeRunner]] = {}

    def runner(self, engine: Any) -> EpisodeRunner:
        """The episode runner for AReaL engine ``engine`` (one per engine, built on first use)."""
        held = self._runners.get(id(engine))
        if held is None or held[0] is not engine:
            adapter = ArealEngine(engine, request_cls=self.areal.ModelRequest, gconfig=self.gconfig,
                                  tokenizer=self.tokenizer, ledger=self.ledger)
            held = (engine, EpisodeRunner(engine=adapter, task=self.task, controller=self.controller,
                                          sampling=self.sampling, verifier=self.verifier,
                                          trajectory_maker=self.trajectory_maker, **self.limits))
            self._runners[id(engine)] = held
        return held[1]

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        """One row as one scaffold episode: AReaL's tensor dict, or None when the episode is rejected."""
        runner = self.runner(engine)
        episode = await runner.run_row(dict(data))
        self.stats["episodes"] += 1
        versions = self.ledger.pop(episode.episode_id)
        rows = self.training_rows(episode, versions, int(engine.get_version()))
        if rows is None:
            return None
        self.stats["samples"] += len(rows)
        return tensor_dict(rows, turn_ids=self.turn_ids)

    def training_rows(self, episode: EpisodeResult, versions: EpisodeVersions,
                      current_version: int) -> list[TokenRow] | None:
        """The episode's rows after the rejection policy (None: reject the episode)."""
        if not episode.ok:
            self.stats["rejected_failed"] += 1
            log.warning("scaffold episode %s rejected: %s failed: %s", episode.episode_id,
                        episode.error_component, episode.error)
            return None
        trajectories = list(episode.trajectories)
        if self.samples == "chosen" and episode.samples:
            index = episode.samples[chosen_index(episode)].sample_index
            trajectories = [t for t in trajectories if t.sample_index == index][:1]
        rows = []
        for t in trajectories:
            if self.reject_truncated and t.finish_reason == "length":
                self.stats["dropped_truncated"] += 1
                continue
            token_versions, unmatched = versions.versions_for(t.input_ids, t.loss_mask, t.versions)
            if unmatched:
                self.stats["versions_unmatched_tokens"] += unmatched
            generated = [v for v, m in zip(token_versions, t.loss_mask) if m and v >= 0]
            if self.max_staleness is not None and generated and current_version - min(generated) > self.max_staleness:
                self.stats["dropped_stale"] += 1
                continue
            rows.append(TokenRow(list(t.input_ids), list(t.loss_mask), [float(x) for x in t.logprobs],
                                 token_versions, float(t.reward)).check())
        if not rows:
            self.stats["rejected_empty"] += 1
            log.warning("scaffold episode %s rejected: no sample left after the rejection policy (%s)",
                        episode.episode_id, dict(self.stats))
            return None
        return rows

    async def aclose(self) -> None:
        """Release the controller's resources and the verifier pool (the rollout worker's end)."""
        runners, self._runners = self._runners, {}
        for _, runner in runners.values():
            await runner.close()
