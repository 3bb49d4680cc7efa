"""The scaffold-methods tests import their scripted engines from methods_testkit (next to this file)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import pytest  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "+", "-", "ки", "what", "is", "seven", "plus", "five", "twelve", "thirteen", "it", "I",
         "think", "two", "four", "so", "one", "the", "answer", "no", "q"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]")


def _config(**extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                       **extra)


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory):
    """A one-layer random sequence classifier (one label) with a word-level tokenizer, saved to a directory."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-classifier")
    LlamaForSequenceClassification(_config(num_labels=1)).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_prm(tmp_path_factory):
    """A one-layer random causal LM as a process reward model, and its tokenizer."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("tiny-prm")
    LlamaForCausalLM(_config()).save_pretrained(path)
    tokenizer = _tokenizer()
    tokenizer.save_pretrained(path)
    return path, tokenizer
