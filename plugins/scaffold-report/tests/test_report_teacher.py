"""The report of an on-policy distillation run: teacher-student KL per step (a training chart) and per sample
(the episode detail carries each sample's KL and the teacher's logprobs, which shade the token view)."""

from __future__ import annotations

from scaffold_report.episodes import Vocab, episode_detail
from scaffold_report.page import training_section


def test_teacher_kl_is_a_training_chart_only_in_runs_that_log_it(tmp_path):
    from scaffold_report.contents import Report

    steps = [{"step": i, "reward_mean": 0.1 * i, "teacher_kl": 2.0 / i, "teacher_kl_max_sample": 3.0 / i}
             for i in range(1, 4)]
    html = training_section(Report(directory=tmp_path, kind="train", steps=steps))
    assert 'aria-label="Teacher-student KL' in html and "teacher_kl_max_sample" in html
    plain = training_section(Report(directory=tmp_path, kind="train", steps=[{"step": 1, "reward_mean": 0.5}]))
    assert "Teacher-student KL" not in plain and "teacher_kl" not in plain  # not listed as missing either


def test_a_samples_detail_has_its_teacher_logprobs_and_kl():
    row = {"sample_index": 0, "prompt_len": 2, "input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 0, 1],
           "logprobs": [0.0, 0.0, -0.5, 0.0, -1.0], "versions": [-1, -1, 0, -1, 0],
           "teacher_logprobs": [0.0, 0.0, -0.25, 0.0, -3.0]}
    record = {"episode_id": "e", "status": "ok", "samples": [{"sample_index": 0, "reward": 1.0}], "trajectories": [row]}
    (sample,) = episode_detail(record, Vocab())["s"]
    assert sample["tlp"] == [-25, 0, -300]  # the completion's, in hundredths as the behaviour logprobs are
    assert sample["kl"] == round(((-0.5 + 0.25) + (-1.0 + 3.0)) / 2, 4)  # generated tokens only
    del row["teacher_logprobs"]
    (plain,) = episode_detail(record, Vocab())["s"]
    assert "tlp" not in plain and "kl" not in plain
