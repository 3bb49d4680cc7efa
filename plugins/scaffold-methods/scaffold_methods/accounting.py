"""Generated tokens per episode, policy and verifier apart, and verification of texts from a controller.

Every method controller of this plugin reports, in its episode's metrics:

* ``policy_tokens``: every token the policy engine generated for the episode,
  including what never became training data (probes, traces a method stopped,
  tokens past a stop string split across calls, pruned tree branches);
* ``verifier_tokens``: tokens a model verifier generated to score the
  episode's responses (an LLM judge, policy self-evaluation; a reward model
  generates none);
* ``probe_tokens`` (Dynasor): the part of ``policy_tokens`` generated to
  answer probes.

Run metrics average them over episodes; ``generated_tokens`` in
``metrics.json`` counts only training tokens (mask 1).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

from scaffold_core.episode import EpisodeContext
from scaffold_core.generation import GenerationTask, VerificationTask
from scaffold_core.verifier import Verdict


@dataclass
class TokenCount:
    policy: int = 0
    verifier: int = 0
    probe: int = 0

    def policy_tasks(self, tasks: Iterable[GenerationTask]) -> None:
        self.policy += sum(len(t.need_result().output_ids) for t in tasks)

    def metrics(self) -> dict[str, float]:
        out = {"policy_tokens": float(self.policy), "verifier_tokens": float(self.verifier)}
        if self.probe:
            out["probe_tokens"] = float(self.probe)
        return out


def verify_texts(ctx: EpisodeContext, texts: list[str]) -> Generator[Any, Any, list[Verdict]]:
    """Verify ``texts`` against the episode's reference with the run's verifier (one yield, concurrently).

    Methods use a verdict's ``vote_key`` (the canonical extracted answer) to
    compare answers; they never decide on its reward.
    """
    if not texts:
        return []
    checks = [VerificationTask(text, ctx.reference) for text in texts]
    yield checks
    return [check.need_verdict() for check in checks]


def question_of(ctx: EpisodeContext) -> str:
    """The episode's question as a verifier should read it: the last user message, else the row's question."""
    for message in reversed(ctx.messages or []):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    question = ctx.row.get("question")
    return str(question) if question is not None else ctx.prompt_text
