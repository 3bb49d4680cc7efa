"""scaffold_core.train.adapters: what adapters inside another trainer share (components, rows, the answer sample)."""

from __future__ import annotations

import pytest

from scaffold_core.builtins.controllers import NativeController
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.episode import EpisodeResult, Sample
from scaffold_core.errors import ConfigError
from scaffold_core.tokenizers import ByteTokenizer
from scaffold_core.train.adapters import (
    PromptTask,
    build_component,
    chosen_index,
    is_object,
    lookup,
    response_text,
    to_plain,
)
from scaffold_core.verifier import Verdict

TOKENIZER = ByteTokenizer()
CHAT = [{"role": "user", "content": "What is 40 + 2?"}]


class Wrapped:
    """A config object of the kind trainers pass (OmegaConf-like mapping with numpy-like values)."""

    def __init__(self, values):
        self.values = values

    def tolist(self):
        return list(self.values)


def test_to_plain_turns_config_objects_into_plain_values():
    assert to_plain({"a": (1, 2), 3: {"b": Wrapped([4, 5])}, "s": "text"}) == {"a": [1, 2], "3": {"b": [4, 5]},
                                                                                  "s": "text"}


def test_components_come_from_names_mappings_or_objects():
    assert isinstance(build_component("controller", "native", path="controller"), NativeController)
    built = build_component("controller", {"name": "best_of_n", "samples": 3}, path="controller")
    assert built.samples == 3
    mine = ExactMatchVerifier()
    assert build_component("verifier", mine, path="verifier") is mine and is_object(mine)
    assert build_component("verifier", None, path="verifier") is None and not is_object(None)
    with pytest.raises(ConfigError, match=r"controller: expected a registered controller name or \{name"):
        build_component("controller", {"samples": 3}, path="controller")
    with pytest.raises(ConfigError, match=r"verifier: expected a registered verifier name .* got 3"):
        build_component("verifier", 3, path="verifier")
    with pytest.raises(Exception, match="majority_vote"):
        build_component("controller", "majority_vot", path="controller")


def test_a_prompt_task_reads_the_chat_and_the_gold_answer_by_dotted_keys():
    task = PromptTask("raw_prompt", "reward_model.ground_truth")
    row = {"raw_prompt": CHAT, "reward_model": {"ground_truth": 42}}
    assert lookup(row, "reward_model.ground_truth") == 42 and lookup(row, "reward_model.style") is None
    prompt = task.build_prompt(row, TOKENIZER)
    assert prompt.ids == TOKENIZER.encode(TOKENIZER.apply_chat_template(CHAT, tokenize=False,
                                                                        add_generation_prompt=True))
    assert task.reference(row) == "42" and prompt.messages == CHAT
    rendered = task.build_prompt({**row, "prompt_ids": [7, 8, 9]}, TOKENIZER)  # ids the trainer rendered
    assert rendered.ids == [7, 8, 9] and rendered.text == TOKENIZER.decode([7, 8, 9])
    with pytest.raises(ValueError, match=r"row\['raw_prompt'\] must be a non-empty list of chat messages"):
        task.build_prompt({"prompt": CHAT}, TOKENIZER)


def sample(index: int, text: str) -> Sample:
    return Sample(prompt_ids=[1], output_ids=[2], output_logprobs=[-0.1], output_mask=[1], text=text,
                  finish_reason="stop", sample_index=index, verdict=Verdict(0.0, extracted=text))


def test_the_chosen_sample_is_chosen_else_the_first_with_the_voted_answer_else_the_first():
    samples = [sample(0, "41"), sample(1, "42"), sample(2, "42")]
    assert chosen_index(EpisodeResult("e", 0, "ok", samples=samples, chosen=2)) == 2
    assert chosen_index(EpisodeResult("e", 0, "ok", samples=samples, answer="42")) == 1
    assert chosen_index(EpisodeResult("e", 0, "ok", samples=samples)) == 0


def test_response_text_drops_special_tokens_and_cuts_at_the_first_stop_string():
    ids = TOKENIZER.encode("#### 42 STOP more END") + [TOKENIZER.eos_token_id]
    assert response_text(TOKENIZER, ids, ("END", "STOP")) == "#### 42 "
    assert response_text(TOKENIZER, ids) == "#### 42 STOP more END" and response_text(TOKENIZER, []) == ""
