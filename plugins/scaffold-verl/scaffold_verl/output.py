"""A finished scaffold episode as the fields of verl's ``AgentLoopOutput``.

verl trains on one trajectory per ``run`` call (its GRPO groups are the
``rollout.n`` calls sharing a ``uid``), so an episode with several samples
hands over its answer: the ``chosen`` sample (``best_of_n``, ``native``
with one sample), else the first sample carrying the voted answer
(``majority_vote``), else the first. The episode's metrics (``maj@k``...)
ride along in ``extra_fields["scaffold"]``.

* ``prompt_ids``: the sample's prompt; ``response_ids``: everything after
  it (model tokens, and environment/tool tokens of multi-turn controllers),
  ``response_mask`` 1 on model tokens and 0 elsewhere, ``response_logprobs``
  the behaviour logprobs (0.0 where the mask is 0; ``None`` when verl asked
  for none), all cut to ``response_length`` as verl's own loops do.
* ``reward_score``: the scaffold verifier's reward, or ``None`` when no
  verifier is configured (verl's reward loop then scores the response).
* ``num_turns``: the prompt plus each run of model or non-model tokens (2 for a single turn).
* ``metrics``: ``generate_sequences`` (seconds in ``server_manager.generate``),
  ``tool_calls`` (0.0), ``num_preempted`` (-1 when the server reports none).
* ``extra_fields``: the last ``TokenOutput.extra_fields`` (``global_steps``),
  ``min_global_steps``/``max_global_steps`` over the weight versions of the
  sample's generated tokens, ``turn_scores`` (per-turn rewards of multi-turn
  controllers), ``tool_rewards``; with on-policy distillation (the sample
  carries a teacher's ``teacher_logprobs``), ``teacher_ids`` (int32) and
  ``teacher_logprobs`` (float32), tensors [S, 1] over the S = prompt + response
  tokens handed over, in verl's own format (what its vLLM teacher's
  ``extract_prompt_logprobs`` builds, which verl's agent loop pops and pads
  into the batch for its distillation losses): entry ``i`` is the next token
  ``i + 1`` and the teacher's logprob of it (0.0 where that token is not
  generated), the last entry a dummy (id 0, 0.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scaffold_core.episode import EpisodeResult
from scaffold_core.train.adapters import chosen_index
from scaffold_core.trajectory import sample_tokens

from .engine import EpisodeLog


def runs(mask: Sequence[int]) -> int:
    """How many runs of equal values ``mask`` has (``[1, 1, 0, 1]``: 3)."""
    return sum(1 for i, m in enumerate(mask) if i == 0 or m != mask[i - 1])


def agent_loop_fields(episode: EpisodeResult, log: EpisodeLog, *, prompt_length: int, response_length: int,
                      scored: bool) -> dict[str, Any]:
    """The ``AgentLoopOutput`` keyword arguments for a successful episode."""
    if not episode.samples or (scored and not episode.trajectories):
        raise ValueError(f"scaffold episode {episode.episode_id} produced no training sample")
    sample = episode.samples[chosen_index(episode)]
    trajectory = next((t for t in episode.trajectories if t.sample_index == sample.sample_index),
                      episode.trajectories[0] if episode.trajectories else None)
    if trajectory is not None:
        cut, input_ids, loss_mask, behaviour = (trajectory.prompt_len, trajectory.input_ids, trajectory.loss_mask,
                                                trajectory.logprobs)
    else:  # no verifier: the sample carries no reward (verl scores it), so no trajectory maker kept it
        input_ids, loss_mask, behaviour, _ = sample_tokens(sample)
        cut = len(sample.prompt_ids)
    prompt_ids = list(input_ids[:cut])
    if len(prompt_ids) > prompt_length:
        raise ValueError(f"the sample's prompt has {len(prompt_ids)} tokens, more than verl's rollout.prompt_length "
                         f"({prompt_length}); shorten it or raise data.max_prompt_length")
    response = list(input_ids[cut:])
    mask = [int(m) for m in loss_mask[cut:]]
    logprobs = [float(x) if m else 0.0 for x, m in zip(behaviour[cut:], mask)]
    extra = dict(log.extra_fields)
    if sample.versions is not None:
        steps = [v for v, m in zip(sample.versions, sample.output_mask) if m]
        if steps:
            extra["min_global_steps"] = min(steps)
            extra["max_global_steps"] = max(steps)
    extra["turn_scores"] = [float(r) for r in sample.turn_rewards or []]
    extra["tool_rewards"] = []
    if trajectory is not None and getattr(trajectory, "teacher_logprobs", None) is not None:
        kept = cut + min(len(response), response_length)
        extra.update(teacher_fields(list(input_ids[:kept]), list(trajectory.teacher_logprobs[:kept])))
    extra["scaffold"] = {"episode_id": episode.episode_id, "samples": len(episode.samples),
                         "chosen": sample.sample_index, "finish_reason": sample.finish_reason,
                         "answer_reward": episode.answer_reward, "metrics": dict(episode.metrics)}
    return dict(
        prompt_ids=prompt_ids,
        response_ids=response[:response_length],
        response_mask=mask[:response_length],
        response_logprobs=logprobs[:response_length] if log.logprobs else None,
        reward_score=float(trajectory.reward) if scored and trajectory is not None else None,
        num_turns=1 + runs(mask),
        metrics={"generate_sequences": log.generate_s, "tool_calls": 0.0,
                 "num_preempted": log.num_preempted if log.num_preempted is not None else -1},
        extra_fields=extra,
    )


def teacher_fields(ids: list[int], column: list[float]) -> dict[str, Any]:
    """``teacher_ids`` and ``teacher_logprobs`` of a sequence in verl's format (see the module docstring)."""
    import torch

    from scaffold_core.teacher import shifted

    return {"teacher_ids": torch.tensor([[t] for t in ids[1:]] + [[0]], dtype=torch.int32),
            "teacher_logprobs": torch.tensor([[v] for v in shifted(column)], dtype=torch.float32)}

