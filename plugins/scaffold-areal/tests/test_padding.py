"""scaffold's tensor dicts are exactly AReaL's rollout batch: keys, dtypes, shapes and values.

The contract pinned here is AReaL's (areal-project/AReaL at cbff54d6): ``RolloutWorkflow.arun_episode``
(``areal/api/workflow_api.py``) returns, for the RLVR workflow (``areal/workflow/rlvr.py``), per episode
``input_ids``/``loss_mask``/``versions``/``turn_ids`` int32, ``logprobs`` float32, ``attention_mask`` bool,
all ``[1, L]``, and ``rewards`` float32 ``[1]``; prompt tokens carry loss mask 0, logprob 0.0, version -1,
turn id -1; ``ModelResponse`` (``areal/api/io_struct.py``) supplies ``output_tokens``,
``output_logprobs`` and per-token ``output_versions``. Episodes are joined by ``concat_padded_tensors``
(``areal/utils/data.py``): right padding with 0 on every 2-D tensor (``attention_mask`` False), 1-D ones
concatenated.
"""

from __future__ import annotations

import pytest
from scaffold_areal.padding import (
    DATASET_TO_BATCH,
    TENSOR_DTYPES,
    TENSOR_KEYS,
    advantages_tensor,
    episode_tensor_dict,
    to_padded_tensor_dict,
    turn_ids_of,
)

from scaffold_core.trajectory import TrainingSample

torch = pytest.importorskip("torch")

AREAL_EPISODE = {  # key: (dtype, shape as a function of the sequence length L)
    "input_ids": (torch.int32, lambda n: (1, n)),
    "loss_mask": (torch.int32, lambda n: (1, n)),
    "logprobs": (torch.float32, lambda n: (1, n)),
    "versions": (torch.int32, lambda n: (1, n)),
    "turn_ids": (torch.int32, lambda n: (1, n)),
    "attention_mask": (torch.bool, lambda n: (1, n)),
    "rewards": (torch.float32, lambda n: (1,)),
}


def areal_rlvr_episode(input_tokens, output_tokens, output_logprobs, output_versions, reward):
    """What AReaL's RLVR workflow returns for one ModelResponse (built here from its documented rules)."""
    n_in, n_out = len(input_tokens), len(output_tokens)
    columns = {
        "input_ids": (input_tokens + output_tokens, torch.int32),
        "loss_mask": ([0] * n_in + [1] * n_out, torch.int32),
        "logprobs": ([0.0] * n_in + output_logprobs, torch.float32),
        "versions": ([-1] * n_in + output_versions, torch.int32),
        "turn_ids": ([-1] * n_in + [0] * n_out, torch.int32),
        "attention_mask": ([True] * (n_in + n_out), torch.bool),
    }
    out = {k: torch.tensor([v], dtype=dtype) for k, (v, dtype) in columns.items()}
    out["rewards"] = torch.tensor([reward], dtype=torch.float32)
    return out


def areal_concat(dicts):
    """AReaL's concat_padded_tensors for [1, L] / [1] tensors: right-pad dim 1 with 0, concatenate dim 0."""
    width = max(d["input_ids"].shape[1] for d in dicts)
    out = {}
    for key in dicts[0]:
        parts = [d[key] for d in dicts]
        if parts[0].dim() >= 2:
            parts = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=0) for p in parts]
        out[key] = torch.cat(parts, dim=0)
    return out


def sample(prompt, output, logprobs, versions, reward, advantage=0.0, mask=None):
    mask = mask or [1] * len(output)
    return TrainingSample(
        input_ids=prompt + output, loss_mask=[0] * len(prompt) + mask,
        logprobs=[0.0] * len(prompt) + [lp if m else 0.0 for lp, m in zip(logprobs, mask)],
        versions=[-1] * len(prompt) + [v if m else -1 for v, m in zip(versions, mask)],
        reward=reward, advantage=advantage, episode_id="e", sample_index=0, group_id="g", prompt_len=len(prompt),
        finish_reason="stop")


def assert_same(ours, theirs):
    assert list(ours) == list(theirs)  # same keys, same order
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert ours[key].shape == theirs[key].shape, key
        assert torch.equal(ours[key], theirs[key]), key


def test_one_episode_is_arun_episodes_dict():
    s = sample([5, 6, 7], [8, 9], [-0.5, -0.25], [3, 4], 1.0)
    ours = episode_tensor_dict(s)
    assert tuple(ours) == TENSOR_KEYS
    for key, (dtype, shape) in AREAL_EPISODE.items():
        assert ours[key].dtype == dtype and tuple(ours[key].shape) == shape(5), key
        assert TENSOR_DTYPES[key] == str(dtype).removeprefix("torch.")
    assert_same(ours, areal_rlvr_episode([5, 6, 7], [8, 9], [-0.5, -0.25], [3, 4], 1.0))


def test_a_batch_is_concat_padded_tensors_of_the_episodes():
    a = sample([5, 6, 7], [8, 9, 10], [-0.5, -0.25, -1.0], [3, 3, 4], 1.0, 0.5)
    b = sample([5, 6], [11], [-2.0], [4], 0.0, -0.5)
    ours = to_padded_tensor_dict([a, b])
    theirs = areal_concat([areal_rlvr_episode([5, 6, 7], [8, 9, 10], [-0.5, -0.25, -1.0], [3, 3, 4], 1.0),
                           areal_rlvr_episode([5, 6], [11], [-2.0], [4], 0.0)])
    assert_same(ours, theirs)
    assert ours["versions"].tolist() == [[-1, -1, -1, 3, 3, 4], [-1, -1, 4, 0, 0, 0]]
    assert "advantages" not in ours  # not part of AReaL's batch


def test_advantages_are_available_on_request():
    a = sample([5], [8], [-0.5], [0], 1.0, 0.75)
    b = sample([5], [9], [-0.5], [0], 0.0, -0.75)
    with_adv = to_padded_tensor_dict([a, b], advantages=True)
    assert with_adv["advantages"].dtype == torch.float32 and with_adv["advantages"].tolist() == [0.75, -0.75]
    assert torch.equal(advantages_tensor([a, b.to_dict()]), with_adv["advantages"])


def test_multi_turn_samples_number_their_turns_and_mask_environment_tokens():
    # prompt 2 tokens, turn 0 (2 tokens), environment (1 token), turn 1 (2 tokens)
    s = sample([1, 2], [3, 4, 99, 5, 6], [-0.1, -0.2, -9.0, -0.3, -0.4], [7, 7, 7, 8, 8], 1.0, mask=[1, 1, 0, 1, 1])
    batch = episode_tensor_dict(s)
    assert batch["turn_ids"].tolist() == [[-1, -1, 0, 0, -1, 1, 1]]
    assert batch["versions"].tolist() == [[-1, -1, 7, 7, -1, 8, 8]]
    assert batch["logprobs"][0, 4].item() == 0.0 and batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1, 1]]
    assert turn_ids_of([]) == [] and turn_ids_of([0, 0]) == [-1, -1]


def test_rows_of_the_saved_dataset_pad_the_same_through_the_documented_mapping():
    s = sample([5, 6], [8], [-0.5], [2], 0.5, 0.25)
    row = s.to_dict()  # the dataset's columns are TrainingSample's fields
    assert set(DATASET_TO_BATCH) <= set(row) and DATASET_TO_BATCH["reward"] == "rewards"
    assert_same(to_padded_tensor_dict([row], advantages=True), to_padded_tensor_dict([s], advantages=True))


def test_padding_options_and_errors():
    s = sample([5, 6], [8], [-0.5], [2], 0.5)
    batch = to_padded_tensor_dict([s], pad_token_id=2, pad_to=5)
    assert batch["input_ids"].tolist() == [[5, 6, 8, 2, 2]] and batch["attention_mask"].sum().item() == 3
    with pytest.raises(ValueError, match="shorter than the longest"):
        to_padded_tensor_dict([s], pad_to=2)
    with pytest.raises(ValueError, match="no samples"):
        to_padded_tensor_dict([])
    bad = s.to_dict()
    bad["logprobs"] = bad["logprobs"][:-1]
    with pytest.raises(ValueError, match="logprobs has 2 entries for 3 input_ids"):
        to_padded_tensor_dict([bad])


def test_padded_tensor_dict_matches_areal_keys():
    a = TrainingSample([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25], [-1, 3, 3], 1.0, 0.5, "e", 0, "e", 1, "stop")
    b = TrainingSample([5, 8], [0, 1], [0.0, -1.0], [-1, 3], 0.0, -0.5, "e", 1, "e", 1, "length")
    batch = to_padded_tensor_dict([a, b.to_dict()], pad_token_id=2)
    assert set(batch) >= {"input_ids", "attention_mask", "loss_mask", "logprobs", "versions", "rewards"}
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 8, 2]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    assert batch["versions"].tolist() == [[-1, 3, 3], [-1, 3, 0]]  # padding is 0, as AReaL pads
    assert batch["rewards"].tolist() == [1.0, 0.0] and batch["rewards"].dtype == torch.float32
    assert batch["logprobs"][0].tolist() == [0.0, -0.5, -0.25]
