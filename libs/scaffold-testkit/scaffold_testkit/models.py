"""Tiny random models for engine tests that check the machinery, not what a model says (torch and transformers
are imported when a model is made)."""

from __future__ import annotations

from typing import Any

from scaffold_core.tokenizers import ByteTokenizer


class NoEosTokenizer(ByteTokenizer):
    """The byte tokenizer without an end-of-sequence token: a random model must not stop early, so every row
    runs to its own ``max_tokens``."""

    eos_token_id = None  # type: ignore[assignment]  # no end-of-sequence token at all


def tiny_llama(seed: int = 0) -> Any:
    """A two-layer Llama with random weights (seed ``seed``) over the byte tokenizer's vocabulary, in eval mode."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=ByteTokenizer().vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()
