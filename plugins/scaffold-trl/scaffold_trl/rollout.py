"""TRL's ``rollout_func`` backed by scaffold: prompts in, scaffold's training samples out in TRL's shape.

TRL (1.16) calls ``rollout_func(prompts, trainer)`` once per generation
batch with every prompt already repeated ``num_generations`` times, back to
back, and expects one completion per entry, in order: ``prompt_ids``,
``completion_ids`` (never empty) and ``logprobs`` (one per completion token;
TRL does not check), plus any extra keys, which reach the reward functions.
Each prompt here is the key of one task row, its identity (see
:class:`PromptIndex`), never its text: rows whose prompts read the same (an
environment that builds each seat's prompt itself, a game dealt from each row's
seed) are different tasks. Each group of copies becomes one
:meth:`TrainingRollouts.run_group` call.

Filtering (``trainer.filter_groups: zero_variance``): the step's groups go
through :func:`scaffold_core.train.filtering.run_step_groups`, which leaves
out groups whose rewards are all equal and rolls out other prompts of the
task in their place (at most ``max_refill_rounds`` rounds). TRL needs exactly
one completion per entry it asked for, so the informative groups come first
and any slot still empty is filled with *padding*: a one-token prompt and
completion whose ``env_mask`` is 0 and whose reward is ``None`` (TRL counts
it as unscorable: advantage 0, left out of its reward statistics). Padding
adds nothing to the loss or its token count (``dapo``, ``bnpo``). A step with
no informative group at all is padding only, and takes no optimizer step
(see ``trainer.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.train.filtering import KEEP_EVERY_GROUP, GroupFilter, StepGroups, refill_from, run_step_groups
from scaffold_core.train.prompt_groups import RolloutGroup, TrainingRollouts

log = logging.getLogger("scaffold.trl")

#: Extra keys handed to the reward function (prefixed: TRL merges them into the dataset rows).
REWARD_KEY = "scaffold_reward"
GROUP_KEY = "scaffold_group"


class PromptIndex:
    """Task rows keyed by their identity (the row's episode id): what TRL's dataset holds and hands back.

    Keys are the task's row ids (``id``, else the row's position), so two rows whose rendered prompts are the
    same text stay two tasks (``same_text`` counts them, for the record). Rows whose prompt cannot be
    rendered are left out and listed in ``unusable``.
    """

    def __init__(self, rollouts: TrainingRollouts):
        from scaffold_core.task import episode_id_of

        self.rows: dict[str, tuple[int, dict[str, Any]]] = {}
        self.same_text = 0
        self.unusable: dict[str, str] = {}
        tokenizer = rollouts.components.engine.tokenizer
        texts: set[str] = set()
        for index, row in enumerate(rollouts.rows()):
            key = episode_id_of(row, index)
            try:
                text = rollouts.components.task.build_prompt(row, tokenizer).text
            except Exception as exc:  # counted and reported, not fatal
                self.unusable[key] = f"{type(exc).__name__}: {exc}"
                continue
            if key in self.rows:
                raise RuntimeError(f"task rows {self.rows[key][0]} and {index} share the id {key!r}; every row "
                                   "needs an id of its own to be trained on")
            self.same_text += text in texts
            texts.add(text)
            self.rows[key] = (index, row)
        if self.same_text:
            log.info("%d task rows render the same prompt text as an earlier row; each is trained as its own task "
                     "(rows are told apart by id)", self.same_text)

    @property
    def prompts(self) -> list[str]:
        """The rows' keys, in task order: TRL's dataset."""
        return list(self.rows)

    @property
    def indexed_rows(self) -> list[tuple[int, dict[str, Any]]]:
        """Every usable row with its position in the task: what a refill draws from."""
        return list(self.rows.values())

    def lookup(self, prompt: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(prompt, str) or prompt not in self.rows:
            shown = prompt if isinstance(prompt, str) else type(prompt).__name__
            raise RuntimeError(f"rollout_func got a prompt that is not one of the task's rows: {str(shown)[:80]!r}")
        return self.rows[prompt]


@dataclass
class RolloutRecord:
    """What one ``rollout_func`` call produced (kept for metrics and for tests).

    ``groups`` (a :class:`StepGroups`) is held for the latest call only; earlier records keep their
    metrics (``RolloutBridge.history``), so memory does not grow with the steps.
    """

    step: int
    version: int
    groups: StepGroups | None
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False

    @property
    def samples(self) -> list[Any]:
        """The samples handed to the trainer."""
        return [s for g in self.groups.used for s in g.samples] if self.groups is not None else []

    def light(self) -> RolloutRecord:
        return RolloutRecord(self.step, self.version, None, self.seconds, self.metrics, self.skipped)


def split_groups(prompts: list[Any], group_size: int) -> list[Any]:
    """The distinct prompts of TRL's batch, checking it is each prompt ``group_size`` times, back to back."""
    if group_size < 1 or len(prompts) % group_size:
        raise RuntimeError(f"rollout_func got {len(prompts)} prompts, not a multiple of num_generations "
                           f"({group_size}); TRL repeats each prompt num_generations times")
    heads = prompts[::group_size]
    for g, head in enumerate(heads):
        if any(p != head for p in prompts[g * group_size:(g + 1) * group_size]):
            raise RuntimeError("rollout_func expected each prompt repeated num_generations times back to back "
                               f"(TRL's RepeatSampler); group {g} mixes prompts")
    return heads


def to_trl_output(groups: list[RolloutGroup], group_size: int, *, slots: int | None = None,
                  pad_id: int = 0) -> dict[str, Any]:
    """TRL's rollout dict, checked: one completion per entry, none empty, one logprob per completion token.

    ``slots``: the number of groups TRL asked for; the slots ``groups`` leave empty are padding (a
    one-token prompt and completion ``[pad_id]``, ``env_mask`` 0, reward ``None``).
    """
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                 REWARD_KEY: [], GROUP_KEY: []}
    for group in groups:
        if len(group.samples) != group_size:
            reasons = "; ".join(f"{e.error_component}: {e.error}" for e in group.failed[:3]) or (
                f"{group.stale_dropped} stale samples dropped" if group.stale_dropped else "the controller made fewer")
            raise RuntimeError(f"prompt group {group.group_id} produced {len(group.samples)} of {group_size} "
                               f"samples ({reasons}); TRL needs exactly num_generations per prompt "
                               "(raise rollout.retries for flaky engines)")
        for s in group.samples:
            n = s.prompt_len
            completion = s.input_ids[n:]
            if not completion:
                raise RuntimeError(f"sample {s.episode_id}/{s.sample_index} has no completion tokens; "
                                   "TRL needs at least one")
            logprobs = s.logprobs[n:]
            if len(logprobs) != len(completion):
                raise RuntimeError(f"sample {s.episode_id}/{s.sample_index}: {len(logprobs)} logprobs for "
                                   f"{len(completion)} completion tokens")
            out["prompt_ids"].append(s.input_ids[:n])
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(s.loss_mask[n:])
            out[REWARD_KEY].append(float(s.reward))
            out[GROUP_KEY].append(group.group_id)
    for _ in range(max(0, (slots or 0) - len(groups)) * group_size):
        for key, value in (("prompt_ids", [pad_id]), ("completion_ids", [pad_id]), ("logprobs", [0.0]),
                           ("env_mask", [0]), (REWARD_KEY, None), (GROUP_KEY, "")):
            out[key].append(value)
    return out


def scaffold(completions: list[Any], scaffold_reward: list[float | None], **_: Any) -> list[float | None]:
    """TRL reward function: the verifier's reward of each sample, as scaffold computed it (metric
    ``rewards/scaffold/mean``); ``None`` for padding (unscorable: advantage 0)."""
    return [None if r is None else float(r) for r in scaffold_reward]


class RolloutBridge:
    """The ``rollout_func`` given to GRPOTrainer: runs scaffold's rollouts on the live weights.

    After each optimizer step (:meth:`sync_weights`, called from a trainer
    callback, and again before generating if a step was missed) the engine is
    told which weights it serves: the trainer's step number becomes the
    engine's weight version, so every token records the policy that sampled
    it. ``sync`` decides how the weights get there: ``None`` when the engine
    wraps the trainer's model (it already sees them, only the version moves);
    otherwise a callable returning the source (a checkpoint directory) for
    ``engine.update_weights``. ``group_filter`` leaves out groups that teach
    nothing and refills them from the task's other rows (drawn with ``seed``).
    ``ledger`` (a :class:`~scaffold_core.train.step_ledger.StepLedger`)
    receives each step's rollouts once the trainer has their advantages
    (:meth:`trained`).
    """

    def __init__(self, rollouts: TrainingRollouts, index: PromptIndex, loop: Any, *, sync: Any = None,
                 timeout: float = 3600.0, group_filter: GroupFilter = KEEP_EVERY_GROUP, seed: int | None = None,
                 ledger: Any = None, pad_id: int = 0):
        self.rollouts = rollouts
        self.index = index
        self.loop = loop
        self.sync = sync
        self.timeout = timeout
        self.group_filter = group_filter
        self.seed = seed
        self.ledger = ledger
        self.pad_id = pad_id
        self.history: list[RolloutRecord] = []
        self.latest: RolloutRecord | None = None

    def sync_weights(self, trainer: Any) -> None:
        """Make the engine serve the trainer's current weights as version ``global_step`` (no-op if it does)."""
        step = int(trainer.state.global_step)
        engine = self.rollouts.components.engine
        if step != engine.weight_version:
            source = self.sync(trainer) if self.sync is not None else None
            self.loop.run(engine.update_weights(source, version=step), self.timeout)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        training = bool(trainer.model.training)
        group_size = trainer.num_generations if training else trainer.num_generations_eval
        heads = split_groups(prompts, group_size)
        rows = [self.index.lookup(p) for p in heads]
        step = int(trainer.state.global_step) + 1  # the optimizer step these rollouts are for
        started = time.perf_counter()
        engine = self.rollouts.components.engine
        self.sync_weights(trainer)
        group_filter = self.group_filter if training else KEEP_EVERY_GROUP
        refill = refill_from(self.index.indexed_rows, rows, seed=self.seed, step=step)
        groups = self.loop.run(run_step_groups(self.rollouts, rows, samples=group_size, step=step,
                                               group_filter=group_filter, refill=refill), self.timeout)
        output = to_trl_output(groups.used, group_size, slots=len(heads), pad_id=self.pad_id)
        record = RolloutRecord(step=step, version=engine.weight_version, groups=groups,
                               seconds=time.perf_counter() - started, skipped=groups.skipped)
        used = len(groups.used) * group_size
        record.metrics = {**groups.metrics(), "rollout_s": round(record.seconds, 3), "completions": used,
                          "generated_tokens": sum(sum(m) for m in output["env_mask"][:used])}
        if groups.skipped:
            log.info("step %d: no prompt group with different rewards after %d refill rounds; no optimizer step",
                     step, groups.refill_rounds)
        self.latest = record
        self.history.append(record.light())
        return output

    def trained(self, advantages: list[float], teacher_logprobs: list[list[float] | None] | None = None) -> None:
        """The trainer's advantages for the latest rollouts (one per entry, padding included), and the
        teacher's logprobs of each entry's completion tokens when a teacher scored them: write the step's
        rollouts to the ledger."""
        record = self.latest
        if record is None or record.groups is None:
            return
        used = sum(len(g.samples) for g in record.groups.used)
        if self.ledger is not None:
            self.ledger.write_step(record.groups, weight_version=record.version, advantages=advantages[:used],
                                   teacher_logprobs=None if teacher_logprobs is None else teacher_logprobs[:used])


async def _gather(coros: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*coros))
