"""Grammar-constrained decoding: a request's :class:`~scaffold_core.sampling.Constraint`, compiled by xgrammar.

An engine keeps one :class:`Grammars` (built on its first constrained request: the
tokenizer's vocabulary is read once) and asks it for a :class:`RowGrammar` per
request. At every decode step, before anything is sampled or a logprob taken,
:func:`mask_logits` sets the logits of the tokens the row's grammar does not allow
next to ``-inf``; after the step the sampled token is fed to the grammar. So:

* every sampled token is one the grammar allows, and the output ends (an
  end-of-sequence token) only where the grammar is complete;
* the logprob recorded for a token is taken from the distribution restricted to
  the allowed tokens and renormalised over them: the distribution the token was
  actually sampled from (temperature-scaled, or untempered for greedy requests,
  as for unconstrained tokens). It is never below the unconstrained logprob; the
  two differ by the log of the probability mass the grammar allowed.

xgrammar (the library SGLang and vLLM use) is imported only here, and only when a
constrained request arrives: ``pip install xgrammar``.
"""

from __future__ import annotations

import importlib.util
import json
from collections import OrderedDict
from typing import Any

from scaffold_core.errors import EngineError
from scaffold_core.sampling import CONSTRAINT_KINDS, Constraint

#: Compiled grammars kept per engine (a served agent repeats its tools and schemas call after call).
CACHE_SIZE = 256


def available_kinds() -> frozenset[str]:
    """The constraint kinds an engine using this module enforces: all of them when xgrammar is installed."""
    return frozenset(CONSTRAINT_KINDS) if importlib.util.find_spec("xgrammar") is not None else frozenset()


class Grammars:
    """Compiles constraints for one tokenizer (``vocab_size``: the model's logits width; ``stop_ids``: the
    tokens that end a sequence, allowed only where the grammar is complete)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: set[int] | frozenset[int]):
        try:
            import xgrammar
        except ImportError as exc:
            raise EngineError("grammar-constrained decoding needs xgrammar: pip install xgrammar",
                              retryable=False) from exc
        self.xgr = xgrammar
        self.vocab_size = int(vocab_size)
        stops = sorted(int(i) for i in stop_ids)
        raw = getattr(tokenizer, "token_bytes", None)
        if callable(raw):  # a tokenizer that knows each token's bytes (scaffold's ByteTokenizer)
            vocab = [raw(i) for i in range(self.vocab_size)]
            info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=self.vocab_size,
                                          stop_token_ids=stops)
        else:
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                           stop_token_ids=stops)
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()

    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar of ``constraint`` (cached); an EngineError naming the problem when it is invalid."""
        found = self._compiled.get(constraint)
        if found is not None:
            self._compiled.move_to_end(constraint)
            return found
        try:
            compiled = self._compile(constraint)
        except Exception as exc:
            raise EngineError(f"the {constraint.kind} constraint cannot be compiled: {type(exc).__name__}: {exc}",
                              retryable=False) from exc
        self._compiled[constraint] = compiled
        if len(self._compiled) > CACHE_SIZE:
            self._compiled.popitem(last=False)
        return compiled

    def _compile(self, constraint: Constraint) -> Any:
        kind, spec = constraint.kind, constraint.spec
        if kind == "json_schema":
            # one spacing (", " and ": "): a small model left free to add whitespace can loop on it until max_tokens
            return self.compiler.compile_json_schema(spec, any_whitespace=False)
        if kind == "regex":
            return self.compiler.compile_regex(spec)
        if kind == "ebnf":
            return self.compiler.compile_grammar(spec)
        return self.compiler.compile_structural_tag(json.loads(spec))

    def row(self, constraint: Constraint) -> RowGrammar:
        return RowGrammar(self.xgr, self.compile(constraint), self.vocab_size)


class RowGrammar:
    """The grammar state of one request: which tokens may come next, fed each sampled token."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int):
        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.broken = False

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one the mask allowed; a refusal means the mask and the matcher disagree)."""
        if not self.matcher.is_terminated() and not self.matcher.accept_token(int(token)):
            self.broken = True

    def allowed(self) -> set[int]:
        """The tokens the grammar allows next (a slow path, for engines that pick tokens one at a time)."""
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        words = bitmask[0].tolist()
        return {w * 32 + b for w, word in enumerate(words) for b in range(32) if (word >> b) & 1
                and w * 32 + b < self.vocab_size}

    @property
    def done(self) -> bool:
        """The grammar is complete and its end token was sampled: nothing may follow."""
        return bool(self.matcher.is_terminated())


def mask_logits(rows: list[RowGrammar | None], logits: Any) -> None:
    """Set, in place, the logits of the tokens each constrained row may not sample next to ``-inf``."""
    constrained = [i for i, g in enumerate(rows) if g is not None]
    if not constrained:
        return
    first = rows[constrained[0]]
    assert first is not None
    xgr = first.xgr
    bitmask = xgr.allocate_token_bitmask(len(rows), first.vocab_size)
    for i in constrained:
        grammar = rows[i]
        assert grammar is not None
        grammar.matcher.fill_next_token_bitmask(bitmask, i)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=constrained)
