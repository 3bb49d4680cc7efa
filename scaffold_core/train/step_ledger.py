"""A training run's rollouts on disk, step by step, in the store and dataset form of ``scaffold run``.

``scaffold train`` gives every trainer a :class:`StepLedger` (``job.ledger``).
After each step the trainer calls :meth:`StepLedger.write_step`: every
episode of the step, completed or failed, goes to the run's store
(``episodes.db``) in one transaction, written by
:class:`~scaffold_core.output.rundir.RunOutput` as ``scaffold run`` writes it
(so nothing of a step stays in memory after it).
Each training sequence is a :class:`TrainedSample`: the usual fields (prompt
and completion ids, loss mask, behaviour logprobs, per-token versions,
reward, the advantage the trainer used) plus the ``step``, the
``weight_version`` its rollouts were generated with, whether the trainer
``used`` it (False for a group left out as zero-variance, or a sample cut
from a group), and the prompt and completion text. At the end
:meth:`StepLedger.finish` derives ``samples.jsonl``, ``failures.jsonl``,
``trajectories/`` (a ``datasets`` dataset with those columns) and
``metrics.json`` exactly as ``scaffold run`` does.

Resuming: :meth:`StepLedger.state` is what a checkpoint keeps (how many
episodes the store holds); :meth:`StepLedger.rewind` deletes the episodes
recorded after it, so the steps after the checkpoint, run again, are recorded
once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..episode import EpisodeResult
from ..errors import RunDirError
from ..output.rundir import RunOutput
from ..output.store import EpisodeStore
from ..teacher import teacher_column
from ..trajectory import TrainingSample
from .filtering import StepGroups
from .prompt_groups import RolloutGroup

_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSample))


@dataclass(slots=True)
class TrainedSample(TrainingSample):
    """A training sequence as a training run used it (or left it out)."""

    step: int = 0
    weight_version: int = 0
    used: bool = False
    prompt_text: str = ""
    completion_text: str = ""


class StepLedger:
    """The rollouts of every step of a training run, recorded in the run directory's store.

    Owns the directory's :class:`RunOutput` (its lock is held until :meth:`close`): ``resume`` continues
    the store there, ``overwrite`` replaces an earlier run's files.
    """

    def __init__(self, directory: str | Path, *, resume: bool = False, overwrite: bool = False,
                 private: bool = True):
        self.dir = Path(directory)
        self.private = private
        self.output = RunOutput(self.dir, resume=resume, overwrite=overwrite, private=private)
        self.steps_written = 0

    # -- writing ----------------------------------------------------------------------------------
    def write_step(self, step: StepGroups | Sequence[RolloutGroup], *, weight_version: int,
                   advantages: Sequence[float] | None = None, number: int | None = None,
                   teacher_logprobs: Sequence[Sequence[float] | None] | None = None) -> int:
        """Append every episode of one step; returns the number of records written.

        ``step``: the step's :class:`StepGroups` (its ``used`` groups are marked used, the others not), or
        a plain list of groups, all used. ``advantages``: the advantage the trainer gave each sample of
        the used groups, in order (group by group, sample by sample); ``None`` keeps the trajectory
        maker's. ``number``: the step's number (default: the StepGroups' own). ``teacher_logprobs``: for each
        of those samples, in the same order, the teacher's logprob of each completion token (the tokens after
        ``prompt_len``; None: not scored); stored per token beside the behaviour logprobs, 0.0 on the prompt
        and on tokens the model did not generate (loss mask 0).
        """
        if isinstance(step, StepGroups):
            used, groups, number = step.used, step.groups, step.step if number is None else number
        else:
            used, groups = list(step), list(step)
            if number is None:
                raise ValueError("write_step: give the step's number when passing a list of groups")
        samples = [sample for group in used for sample in group.samples]
        if advantages is None:
            advantages = [sample.advantage for sample in samples]
        elif len(advantages) != len(samples):
            raise ValueError(f"write_step: {len(advantages)} advantages for {len(samples)} samples in the used groups")
        chosen = {id(sample): float(a) for sample, a in zip(samples, advantages)}
        teacher: dict[int, list[float]] = {}
        if teacher_logprobs is not None:
            if len(teacher_logprobs) != len(samples):
                raise ValueError(f"write_step: {len(teacher_logprobs)} teacher logprob rows for {len(samples)} "
                                 "samples in the used groups")
            for sample, row in zip(samples, teacher_logprobs):
                if row is not None:
                    teacher[id(sample)] = teacher_row(sample, row)
        written = 0
        for group in groups:
            for episode in group.episodes:
                self.output.append(_trained(episode, number, weight_version, chosen, teacher))
                written += 1
        self.steps_written += 1
        return written

    # -- resuming ---------------------------------------------------------------------------------
    def _store(self) -> EpisodeStore:
        self.output.flush()
        self.output.open()
        assert self.output.store is not None
        return self.output.store

    def episodes(self) -> int:
        """How many episodes the store holds (0 when there is none yet)."""
        if self.output.store is None and not self.output.store_path.exists():
            return 0
        return self._store().count()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to rewind the store to this point: its last episode row."""
        if self.episodes() == 0:
            return {"store_rows": 0}
        last = self._store().db.execute("SELECT max(seq) FROM episodes").fetchone()[0]
        return {"store_rows": int(last or 0)}

    def rewind(self, state: dict[str, Any] | None) -> None:
        """Delete the episodes recorded after ``state`` (from :meth:`state`; ``None``: every episode), before
        anything new is written. A store that holds less than the checkpoint recorded is not the one it saw:
        refused."""
        keep = int((state or {}).get("store_rows") or 0)
        if keep == 0 and self.episodes() == 0:
            return
        store = self._store()
        last = int(store.db.execute("SELECT coalesce(max(seq), 0) FROM episodes").fetchone()[0])
        if last < keep:
            raise RunDirError(f"{store.path}: its last episode is row {last}, before the row {keep} the checkpoint "
                              "recorded; the store is not the one this run wrote: resume from an earlier "
                              "checkpoint, or start again with --overwrite", path=str(store.path))
        if last > keep:
            store.db.execute("DELETE FROM episodes WHERE seq > ?", (keep,))

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, *, save_dataset: bool = True, save_parquet: bool = False,
               rollout_s: float | None = None) -> dict[str, Any]:
        """Close the store and export samples, failures, the trajectories dataset and ``metrics.json`` from
        it (as at the end of ``scaffold run``); returns those metrics. ``rollout_s``: the seconds the steps
        spent generating rollouts (their ``rollout_s``), the time ``wall_s`` and ``tokens_per_s`` are over;
        without it neither is written (the export's own time is not the run's)."""
        from ..plugins.lifecycle import Hooks
        from ..run.finalize import finalize_run_dir

        self.output.close()
        live: dict[str, Any] = {}
        if rollout_s:
            live["wall_s"] = round(rollout_s, 3)
        metrics = finalize_run_dir(self.dir, live, hooks=Hooks(None), save_dataset=save_dataset,
                                   save_parquet=save_parquet, private=self.private)
        if rollout_s:
            tokens = int(metrics.get("generated_tokens") or 0)
            metrics["tokens_per_s"] = round(tokens / rollout_s, 3)
            metrics["wall_s_is"] = "rollout time summed over the training steps"
            from ..output.rundir import write_metrics

            write_metrics(self.dir, metrics, private=self.private)
        return metrics

    def close(self) -> None:
        """Close the ledger and release the directory's lock (safe twice)."""
        try:
            self.output.close()
        finally:
            self.output.release()


def teacher_row(sample: TrainingSample, completion: Sequence[float]) -> list[float]:
    """The teacher's logprobs of ``sample``'s completion as a column beside its ``logprobs``
    (:func:`~scaffold_core.teacher.teacher_column`)."""
    try:
        return teacher_column(sample.input_ids, sample.loss_mask, sample.prompt_len, completion)
    except ValueError as exc:
        raise ValueError(f"sample {sample.episode_id}/{sample.sample_index}: {exc}") from None


def _trained(episode: EpisodeResult, step: int, version: int, chosen: dict[int, float],
             teacher: dict[int, list[float]] | None = None) -> EpisodeResult:
    """``episode`` with its training sequences as :class:`TrainedSample` (the episode itself is not changed)."""
    texts = {s.sample_index: s.text for s in episode.samples}
    rows = []
    for t in episode.trajectories:
        base = {name: getattr(t, name) for name in _BASE_FIELDS}
        base["advantage"] = chosen.get(id(t), 0.0)
        if teacher and id(t) in teacher:
            base["teacher_logprobs"] = teacher[id(t)]
        rows.append(TrainedSample(**base, step=step, weight_version=version, used=id(t) in chosen,
                                  prompt_text=episode.prompt_text, completion_text=texts.get(t.sample_index, "")))
    return dataclasses.replace(episode, trajectories=rows)
