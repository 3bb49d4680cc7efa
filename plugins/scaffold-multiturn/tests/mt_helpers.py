"""Helpers shared by the scaffold-multiturn tests (imported as a plain module)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from scaffold_testkit import ScriptedEngine, make_contexts, plugin_set, run_episodes

import scaffold_gsm8k
import scaffold_multiturn
from scaffold_core.engine import Engine
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import ByteTokenizer


def registry(*extra: Any) -> Any:
    """A registry with the built-ins, scaffold-multiturn, scaffold-gsm8k and ``extra`` plugins."""
    named = {"multiturn": scaffold_multiturn, "gsm8k": scaffold_gsm8k}
    named.update({f"extra-{i}": p for i, p in enumerate(extra)})
    plugins = plugin_set(**named)
    assert not plugins.registry.broken, plugins.registry.broken
    return plugins.registry


def controller(reg: Any = None, **options: Any) -> Any:
    options.setdefault("environment", "verifier_feedback")
    return (reg or registry()).create("controller", "multiturn_chat", options, path="controller")


def assistant_turns(prompt: str, header: str = "<|assistant|>") -> int:
    """How many assistant headers the rendered prompt holds (= the turn about to be generated)."""
    return prompt.count(header)


class TokenizerScriptedEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` speaking through another tokenizer (e.g. SmolLM2's): no model, exact ids."""

    def __init__(self, tokenizer: Any, respond: Any, **options: Any):
        super().__init__(respond, **options)
        self.tokenizer = tokenizer

    def result_for(self, text: str, request: GenerationRequest) -> GenerationResult:
        tok = self.tokenizer
        ids = list(tok.encode(text, add_special_tokens=False)) + [tok.eos_token_id]
        cut = ids[:request.sampling.max_tokens]
        finish = "stop" if len(cut) == len(ids) else "length"
        logprobs = [-(1.0 + math.sin(t)) / 2.0 - 0.01 for t in cut]
        return GenerationResult(cut, logprobs, finish, tok.decode(cut, skip_special_tokens=True), 0)


class IdsEngine(Engine):
    """Answers with raw token ids: ``respond(prompt_ids, request) -> (ids, finish_reason)``; records results.

    Each result's policy ``weight_version`` is the number of requests served before it (as if the weights
    were updated between turns)."""

    def __init__(self, respond: Callable[..., tuple[list[int], str]], tokenizer: Any = None):
        self.tokenizer = tokenizer or ByteTokenizer()
        self.respond = respond
        self.results: list[tuple[GenerationRequest, GenerationResult]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        ids, finish = self.respond(request.prompt_ids, request)
        logprobs = [-0.5 - 0.001 * (i % 97) for i in range(len(ids))]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        result = GenerationResult(list(ids), logprobs, finish, text, len(self.results))
        self.results.append((request, result))
        return result


class JinjaByteTokenizer(ByteTokenizer):
    """The core ByteTokenizer with a Jinja chat template of our choosing (no model, no download).

    ``merges`` maps strings to extra token ids that encode as one token, so a
    test can make text merge across a turn boundary.
    """

    def __init__(self, template: str, merges: Sequence[str] = ()):
        import jinja2

        self.chat_template = template
        self._template = jinja2.Environment(trim_blocks=False, lstrip_blocks=False).from_string(template)
        self.merges = list(merges)

    @property
    def vocab_size(self) -> int:
        return self.OFFSET + 256 + len(self.merges)

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = False, **_: Any) -> Any:
        text = self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not self.merges:
            return super().encode(text)
        pattern = "(" + "|".join(re.escape(m) for m in self.merges) + ")"
        ids: list[int] = []
        for i, part in enumerate(re.split(pattern, text)):
            if i % 2:
                ids.append(self.OFFSET + 256 + self.merges.index(part))
            elif part:
                ids.extend(super().encode(part))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out, plain = [], []
        for tid in ids:
            if tid >= self.OFFSET + 256:
                if plain:
                    out.append(super().decode(plain, skip_special_tokens))
                    plain = []
                out.append(self.merges[tid - self.OFFSET - 256])
            else:
                plain.append(tid)
        if plain:
            out.append(super().decode(plain, skip_special_tokens))
        return "".join(out)


def run(task: Any, engine: Any, ctrl: Any, *, verifier: Any = None, maker: Any = None, max_tokens: int = 64,
        temperature: float = 1.0, concurrency: int = 8, timeout: float = 120.0) -> list[Any]:
    """Run every row of ``task`` through the real runtime; results in row order."""
    from scaffold_core.builtins.verifiers import ExactMatchVerifier
    from scaffold_multiturn.trajectory import MultiTurnTrajectoryMaker

    contexts = make_contexts(task, engine.tokenizer, SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                                                    seed=3))
    return run_episodes(contexts, engine=engine, controller=ctrl, verifier=verifier or ExactMatchVerifier(),
                        trajectory_maker=maker or MultiTurnTrajectoryMaker(), concurrency=concurrency,
                        timeout=timeout)
