"""Sampling parameters: what flows, explicitly, from config to every engine request."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

#: The grammar forms a :class:`Constraint` may take (SGLang's ``sampling_params`` names; xgrammar compiles them).
CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass(frozen=True, slots=True)
class Constraint:
    """A grammar every sampled token must keep the output within (grammar-constrained decoding).

    ``kind`` is one of :data:`CONSTRAINT_KINDS` and ``spec`` its text, as SGLang's
    native ``sampling_params`` and xgrammar take them: ``json_schema`` (a JSON
    Schema as JSON text), ``regex``, ``ebnf`` (xgrammar's EBNF, ``root ::= ...``)
    or ``structural_tag`` (xgrammar's structural-tag JSON, e.g. a fixed text
    followed by a JSON object). The output ends (the engine's end-of-sequence
    token) only once the grammar is complete. ``reason`` names what asked for
    it (``tool_choice: required``) for error messages. Engines list the kinds
    they enforce in :attr:`~scaffold_core.engine.Engine.constraints`; a request
    with a constraint its engine cannot enforce fails, never runs unconstrained.
    """

    kind: str
    spec: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}")
        if not isinstance(self.spec, str) or not self.spec:
            raise ValueError("a constraint needs its grammar (a non-empty string)")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one generation.

    ``max_tokens`` has no default on purpose: an unset limit once let a server's
    16-token default silently zero every reward in the system this project
    learns from. ``temperature == 0`` means greedy decoding. ``top_k == -1``
    means the whole vocabulary. ``seed`` is the base seed; each request gets
    its own seed derived from it, the episode and the sample index.
    ``top_logprobs`` > 0 asks the engine for the log-probabilities of that
    many most likely tokens at every output position
    (:attr:`~scaffold_core.generation.GenerationResult.top_logprobs`); it is a
    per-request field controllers set (confidence measures, self-evaluation),
    not a config key. An engine that cannot give them leaves that field
    ``None``, and callers fall back to the sampled tokens' logprobs.
    ``constraint``: a :class:`Constraint` the output must follow (a per-request
    field, like ``top_logprobs``: a served client's forced tool call or JSON
    output); ``None``: unconstrained.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (whole vocabulary) or >= 1, got {self.top_k!r}")
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int) or self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be an integer >= 0 (0: none), got {self.top_logprobs!r}")
        if isinstance(self.stop, (list, str)):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        out["stop_token_ids"] = list(self.stop_token_ids)
        return out


_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, *numbers: int) -> int:
    """A fast, stable 63-bit seed from a seed and small integers (splitmix64 steps)."""
    x = seed & _MASK64
    for n in numbers:
        x = (x + 0x9E3779B97F4A7C15 * (n + 1)) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


def derive_seed(base: int | None, *parts: object) -> int:
    """A stable 63-bit seed from a base seed and identifying parts (episode id, sample index)."""
    text = "\x1f".join([str(base if base is not None else 0), *map(str, parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1

