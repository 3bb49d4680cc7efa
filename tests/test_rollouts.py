"""An episode whose agent run produced several samples (a client that rewrote its history) counts once: one reward
in reward_mean, one attempt in pass@k, one member of its GRPO group whose samples share the advantage."""

from __future__ import annotations

from scaffold_core.builtins.trajectories import GRPOTrajectoryMaker
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.output.store import record_of, result_of
from scaffold_core.run.metrics import RunMetrics
from scaffold_core.verifier import Verdict


def sample(reward: float, rollout: int | None, index: int) -> Sample:
    return Sample([1, 2], [3, 4], [-0.5, -0.5], [1, 1], "x", "stop", sample_index=index,
                  verdict=Verdict(reward, "x", None, ""), rollout=rollout)


def agent_episode() -> EpisodeResult:
    """Two agent runs: the first split into three samples (reward 1), the second one sample (reward 0)."""
    samples = [sample(1.0, 0, 0), sample(1.0, 0, 1), sample(1.0, 0, 2), sample(0.0, 1, 3)]
    return EpisodeResult("e", 0, "ok", samples=samples)


def test_the_samples_of_one_agent_run_count_once_in_every_metric():
    metrics = RunMetrics()
    metrics.add(agent_episode())
    summary = metrics.summary()
    assert summary["samples"] == 4 and summary["rollouts"] == 2
    assert summary["reward_mean"] == 0.5  # (1 + 0) / 2 runs, not 3/4 samples
    assert summary["pass@2"] == 1.0 and "pass@4" not in summary
    assert summary["accuracy"] == 0.5


def test_samples_without_a_rollout_are_each_their_own():
    metrics = RunMetrics()
    metrics.add(EpisodeResult("e", 0, "ok", samples=[sample(1.0, None, 0), sample(0.0, None, 1),
                                                      sample(0.0, None, 2)]))
    summary = metrics.summary()
    assert summary["rollouts"] == 3 and summary["pass@3"] == 1.0 and abs(summary["reward_mean"] - 1 / 3) < 1e-6


def test_rollouts_survive_the_store_and_combined_worker_totals():
    episode = agent_episode()
    rebuilt = result_of(record_of(episode))
    assert [s.rollout for s in rebuilt.samples] == [0, 0, 0, 1]
    one, two = RunMetrics(), RunMetrics()
    one.add(rebuilt)
    two.add(agent_episode())
    combined = RunMetrics.from_states([one.state(), two.state()]).summary()
    assert combined["rollouts"] == 4 and combined["reward_mean"] == 0.5


def test_grpo_gives_every_sample_of_a_run_the_runs_advantage():
    made = GRPOTrajectoryMaker().make(agent_episode())
    advantages = [t.advantage for t in made]
    assert advantages[0] == advantages[1] == advantages[2] > 0 > advantages[3]
    assert abs(advantages[0] + advantages[3]) < 1e-9  # a group of two runs, mean-centred: +a and -a
