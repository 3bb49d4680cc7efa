"""Conformance tests for trajectory makers: key set, equal lengths, masks, token faithfulness."""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import pytest

from ._common import ComponentConformance, finite_number

#: Keys every training sample carries (``TrainingSample.to_dict()``).
REQUIRED_KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "reward", "advantage", "episode_id",
                 "sample_index", "group_id", "prompt_len", "finish_reason")


def _sample(prompt: list[int], output: list[int], mask: list[int], reward: float, index: int,
            finish: str = "stop", version: Any = 3, versions: list[int] | None = None) -> Any:
    from scaffold_core.episode import Sample
    from scaffold_core.verifier import Verdict

    logprobs = [-(0.1 + 0.01 * ((t * 7 + i) % 13)) if m else 0.0 for i, (t, m) in enumerate(zip(output, mask))]
    return Sample(prompt_ids=list(prompt), output_ids=list(output), output_logprobs=logprobs, output_mask=list(mask),
                  text=f"response {index}", finish_reason=finish, sample_index=index, weight_version=version,
                  verdict=Verdict(reward, str(reward), str(reward), "scripted"), versions=versions)


def example_episodes() -> list[Any]:
    """Finished episodes covering what makers meet: a group of 4, a lone sample, environment tokens, and
    groups whose samples are all wrong or all right (equal rewards: a zero spread to normalise by)."""
    from scaffold_core.episode import EpisodeResult

    prompt = [11, 12, 13, 14, 15]
    group = [_sample(prompt, [20 + i for i in range(3 + 2 * k)], [1] * (3 + 2 * k), float(k % 2 == 0), k,
                     finish="stop" if k < 3 else "length") for k in range(4)]
    lone = [_sample([7, 8, 9], [30, 31], [1, 1], 1.0, 0, version=None)]
    # multi-turn: generated [40, 41] on weights 3, environment [50, 51, 52] (mask 0), generated [42, 43] on 4
    turns = [_sample([1, 2, 3, 4], [40, 41, 50, 51, 52, 42, 43], [1, 1, 0, 0, 0, 1, 1], 0.5, 0,
                     versions=[3, 3, -1, -1, -1, 4, 4])]
    all_wrong = [_sample(prompt, [60 + k, 61], [1, 1], 0.0, k) for k in range(4)]
    all_right = [_sample(prompt, [70 + k, 71, 72], [1, 1, 1], 1.0, k) for k in range(3)]
    return [
        EpisodeResult(episode_id="group", index=0, status="ok", reference="1", samples=group),
        EpisodeResult(episode_id="lone", index=1, status="ok", reference="1", samples=lone),
        EpisodeResult(episode_id="turns", index=2, status="ok", reference="1", samples=turns),
        EpisodeResult(episode_id="all-wrong", index=3, status="ok", reference="1", samples=all_wrong),
        EpisodeResult(episode_id="all-right", index=4, status="ok", reference="1", samples=all_right),
    ]


class TrajectoryMakerConformance(ComponentConformance):
    """Subclass this in your plugin's tests to check a trajectory maker against the contract.

    Set ``name``/``plugin`` (or override :meth:`make_trajectory_maker`); the
    episodes it is fed are :meth:`make_episodes` (override to add your own)::

        class TestMyMaker(TrajectoryMakerConformance):
            plugin = scaffold_mymaker
            name = "mymaker"

    Prompt tokens must have loss mask 0, logprob 0.0 and version -1;
    ``input_ids`` must be the sample's prompt ids followed by its output ids,
    exactly (never re-tokenized); generated tokens keep the engine's logprobs.
    """

    kind: ClassVar[str] = "trajectory_maker"

    def make_trajectory_maker(self) -> Any:
        """The trajectory maker under test (default: built by ``name`` through the registry)."""
        return self.build()

    def make_episodes(self) -> list[Any]:
        """Finished episodes to turn into training samples."""
        return example_episodes()

    def trajectories(self) -> list[tuple[Any, list[Any]]]:
        maker = self.make_trajectory_maker()
        out = []
        for episode in self.make_episodes():
            made = maker.make(episode)
            assert isinstance(made, list), f"make() returned {type(made).__name__}, not a list"
            out.append((episode, made))
        assert any(made for _, made in out), "make() returned no training samples for any episode"
        return out

    # -- tests -----------------------------------------------------------
    def test_key_set(self) -> None:
        """Every training sample has ``to_dict()`` with the keys trainers rely on."""
        for _, made in self.trajectories():
            for item in made:
                row = item.to_dict()
                missing = [k for k in REQUIRED_KEYS if k not in row]
                assert not missing, f"training sample lacks {missing}"

    def test_equal_lengths(self) -> None:
        """``input_ids``, ``loss_mask``, ``logprobs`` and ``versions`` have one entry per token."""
        for _, made in self.trajectories():
            for item in made:
                row = item.to_dict()
                n = len(row["input_ids"])
                assert n > 0
                for key in ("loss_mask", "logprobs", "versions"):
                    assert len(row[key]) == n, f"{key} has {len(row[key])} entries for {n} input_ids"

    def test_masks(self) -> None:
        """Masks are 0/1; prompt tokens are masked out with logprob 0.0 and version -1."""
        for _, made in self.trajectories():
            for item in made:
                row = item.to_dict()
                p = row["prompt_len"]
                assert set(row["loss_mask"]) <= {0, 1}, "loss_mask holds values other than 0 and 1"
                assert row["loss_mask"][:p] == [0] * p, "prompt tokens must have loss mask 0"
                assert row["logprobs"][:p] == [0.0] * p, "prompt tokens must have logprob 0.0"
                assert row["versions"][:p] == [-1] * p, "prompt tokens must have version -1"
                assert any(row["loss_mask"]), "a training sample with no trained token"
                for m, lp, v in zip(row["loss_mask"], row["logprobs"], row["versions"]):
                    if not m:
                        assert lp == 0.0 and v == -1, "masked-out tokens must have logprob 0.0 and version -1"

    def test_token_faithful(self) -> None:
        """``input_ids`` are prompt + output ids as sampled; generated tokens keep the engine's logprobs and the
        weight version that sampled them."""
        for episode, made in self.trajectories():
            by_index = {s.sample_index: s for s in episode.samples}
            for item in made:
                row = item.to_dict()
                sample = by_index.get(row["sample_index"])
                assert sample is not None, f"sample_index {row['sample_index']} is not a sample of the episode"
                assert row["episode_id"] == episode.episode_id
                assert row["input_ids"] == [*sample.prompt_ids, *sample.output_ids], "input_ids were changed"
                assert row["prompt_len"] == len(sample.prompt_ids)
                p = row["prompt_len"]
                assert row["loss_mask"][p:] == list(sample.output_mask), "output loss mask differs from the sample's"
                for m, got, want in zip(sample.output_mask, row["logprobs"][p:], sample.output_logprobs):
                    if m:
                        assert got == pytest.approx(want), "a generated token's logprob was changed"
                if sample.versions is not None:
                    for m, got, want in zip(sample.output_mask, row["versions"][p:], sample.versions):
                        if m:
                            assert got == want, "a generated token lost the weight version that sampled it"

    def test_numbers_are_finite(self) -> None:
        """Rewards and advantages are finite numbers."""
        for _, made in self.trajectories():
            for item in made:
                row = item.to_dict()
                for key in ("reward", "advantage"):
                    assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), f"{key} = {row[key]!r}"

    def test_equal_rewards_give_finite_advantages(self) -> None:
        """A group whose samples all got the same reward (all wrong, all right) gets finite advantages, all
        equal: nothing to prefer, and no division by a zero spread."""
        maker = self.make_trajectory_maker()
        for episode in self.make_episodes():
            rewards = {s.reward for s in episode.samples}
            if len(episode.samples) < 2 or len(rewards) != 1:
                continue
            advantages = [t.to_dict()["advantage"] for t in maker.make(episode)]
            assert all(finite_number(a) for a in advantages), (
                f"episode {episode.episode_id!r} (every reward {rewards.pop()!r}) got advantages {advantages}: "
                "normalise by (std + eps), or give 0 when the spread is 0")
            assert len(set(advantages)) <= 1, f"equal rewards got different advantages {advantages}"

    def test_make_leaves_class_state_unchanged(self) -> None:
        """``make()`` changes no class-level container of the maker's classes."""
        maker = self.make_trajectory_maker()
        self.assert_class_state_unchanged(maker, lambda: [maker.make(e) for e in self.make_episodes()], "make()")

    def test_json_serialisable(self) -> None:
        """Training samples serialise to JSON (they are written to the run's store as JSON)."""
        for _, made in self.trajectories():
            for item in made:
                json.dumps(item.to_dict())

    def test_episode_is_not_modified(self) -> None:
        """``make()`` reads the episode without changing it."""
        from .controllers import _snapshot

        maker = self.make_trajectory_maker()
        for episode in self.make_episodes():
            before = _snapshot(episode)
            maker.make(episode)
            assert _snapshot(episode) == before, f"make() modified episode {episode.episode_id}"

    def test_deterministic(self) -> None:
        """The same episode gives the same training samples."""
        maker = self.make_trajectory_maker()
        for episode in self.make_episodes():
            assert [t.to_dict() for t in maker.make(episode)] == [t.to_dict() for t in maker.make(episode)]

    def test_episode_without_samples(self) -> None:
        """An episode with no samples gives no training samples (and does not raise)."""
        from scaffold_core.episode import EpisodeResult

        assert self.make_trajectory_maker().make(EpisodeResult("empty", 0, "ok")) == []
