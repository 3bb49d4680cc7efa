"""The ``judge`` verifier: an LLM reads the question and a response and scores it by a rubric.

Where the judge runs (``engine``/``url``):

* ``engine: policy`` (default): the run's own engine. Only a controller can
  ask it (``rerank``, ``tree_search``: their ``scorer``): the judgement is
  generated as part of the episode, batched with its other requests, and
  counted in its ``verifier_tokens``. As the run's verifier it is refused.
* ``engine: {name: ..., ...}``: another engine, built from that section.
* ``url: http://host:port/v1`` and ``model``: any OpenAI-compatible server
  (``api_key_env`` names the environment variable holding a key).

How it judges (``mode``):

* ``score``: the judge writes a judgement ending in a score on
  ``low``..``high`` (default 0-10); :func:`~scaffold_methods.judgement.parse_score`
  reads it and the reward is the score scaled to [0, 1].
* ``yes_no``: the judge answers one token to "is it correct?"; the reward is
  P(yes) / (P(yes) + P(no)) from the engine's top logprobs (or the answered
  token's probability when the engine gives none).

A malformed judgement leaves the response **unscored**: as the run's
verifier the verdict is :meth:`Verdict.unscored` (the sample has no reward
and is left out of training, never read as 0.0); as a scorer the response
gets no score and ranks below every scored one. A judge that cannot be
reached fails the episode (retryable), never a silent zero.

As the run's verifier the judge sees only the response and the reference
(the verifier contract passes no question); ``{question}`` is then empty.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt

from scaffold_core.episode import EpisodeContext
from scaffold_core.generation import AwaitTask, GenerationTask
from scaffold_core.plugins import Help
from scaffold_core.sampling import SamplingParams
from scaffold_core.tokenizers import render_chat
from scaffold_core.verifier import Reference, Verdict, Verifier, reference_answers

from .backends import Ask, EngineBackend, Judged, UrlBackend, judged_from_result
from .judgement import parse_score, yes_probability
from .scoring import SCORER_INDEX, Scores

DEFAULT_SYSTEM = ("You are a strict grader. Read the question and the response, check the response's reasoning "
                  "and final answer, and grade it.")
SCORE_TEMPLATE = ("Question:\n{question}\n\nResponse:\n{response}\n\nHow likely is the response's final answer to be "
                  "correct, from {low} (certainly wrong) to {high} (certainly right)? Reply with one line: "
                  "Score: <number>")
YES_NO_TEMPLATE = "Question:\n{question}\n\nResponse:\n{response}\n\nIs the response correct? Answer Yes or No."
PARTIAL_YES_NO_TEMPLATE = ("Question:\n{question}\n\nThe first steps of a solution:\n{response}\n\nAre these steps "
                           "correct so far? Answer Yes or No.")
REFERENCE_LINE = "\n\nThe correct answer is: {reference}"
_PLACEHOLDER = re.compile(r"\{(low|high|reference|question|response)\}")

#: Judges that hold an engine or a private loop, closed by the plugin's ``on_run_end`` hook.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


class JudgeVerifier(Verifier):
    """An LLM judge (see the module docstring for its options)."""

    executor: ClassVar[str] = "thread"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, engine: str | dict[str, Any] = "policy", url: str | None = None, model: str | None = None,
                 api_key_env: str | None = None, mode: Literal["score", "yes_no"] = "score", low: float = 0.0,
                 high: float = 10.0, system: str | None = DEFAULT_SYSTEM, template: str | None = None,
                 partial_template: str | None = None,
                 max_tokens: Annotated[int, Ge(1), Help("tokens of the judge's reply")] = 64, temperature: float = 0.0,
                 top_logprobs: Annotated[int, Ge(0)] = 20, use_reference: bool = False,
                 timeout: Annotated[float, Gt(0), Help("seconds one judgement may take")] = 120.0,
                 start_timeout: float = 900.0):
        if not low < high:
            raise ValueError(f"the judge's scale needs low < high, got low={low}, high={high}")
        for name, text in (("template", template), ("partial_template", partial_template)):
            if text is not None and "{response}" not in text:
                raise ValueError(f"{name} must contain {{response}} where the response goes")
        self.mode = mode
        self.low, self.high = float(low), float(high)
        self.system = system
        default = SCORE_TEMPLATE if mode == "score" else YES_NO_TEMPLATE
        self.template = template or default
        self.partial_template = partial_template or (PARTIAL_YES_NO_TEMPLATE if mode == "yes_no" else self.template)
        self.ask = Ask(max_tokens=1 if mode == "yes_no" else max_tokens, temperature=temperature,
                       top_logprobs=top_logprobs if mode == "yes_no" else 0)
        self.use_reference = use_reference
        self.timeout = timeout
        self.backend: Any = None
        if url is not None:
            if engine != "policy":
                raise ValueError("give the judge either url (an OpenAI-compatible server) or engine, not both")
            self.backend = UrlBackend(url, model or "", api_key_env=api_key_env, timeout=timeout)
        elif engine != "policy":
            if not isinstance(engine, dict):
                raise ValueError(f"engine must be 'policy' or an engine section like {{name: transformers}}, "
                                 f"got {engine!r}")
            self.backend = EngineBackend(engine, start_timeout=start_timeout, timeout=timeout)
            LIVE.add(self)

    def where(self) -> str:
        return "the run's engine" if self.backend is None else self.backend.label()

    # -- prompts and readings ---------------------------------------------------------------------
    def messages(self, question: str, response: str, reference: Reference = None,
                 partial: bool = False) -> list[dict[str, str]]:
        """The chat the judge reads (placeholders replaced literally: braces in a response are safe)."""
        template = self.partial_template if partial else self.template
        if self.use_reference and reference is not None and "{reference}" not in template:
            template += REFERENCE_LINE
        answers = " or ".join(reference_answers(reference)) if isinstance(reference, (str, int, float, list)) \
            else ("" if reference is None else str(reference))
        values = {"low": f"{self.low:g}", "high": f"{self.high:g}", "reference": answers, "question": question,
                  "response": response}
        text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)  # one pass: texts are never re-read
        out = [{"role": "system", "content": self.system}] if self.system else []
        return out + [{"role": "user", "content": text}]

    def reading(self, judged: Judged) -> tuple[float | None, str]:
        """(score in [0, 1] or None when the judgement is malformed, the reason)."""
        if self.mode == "yes_no":
            return yes_probability(judged.top, judged.sampled)
        return parse_score(judged.text, self.low, self.high)

    # -- as the run's verifier ----------------------------------------------------------------------
    def verify(self, response: str, reference: Reference) -> Verdict:
        if self.backend is None:
            raise ValueError("a judge on engine: policy scores inside a controller (the scorer of rerank or "
                             "tree_search); as the run's verifier give it url: (an OpenAI-compatible server) or "
                             "engine: {name: ...} (another engine)")
        judged = self.backend.complete_sync(self.messages("", response, reference), self.ask)
        score, reason = self.reading(judged)
        if score is None:
            return Verdict.unscored(f"malformed judgement: {reason}", extracted=judged.text[:200] or None)
        return Verdict(score, judged.text[:200], None, reason)

    # -- as a scorer inside an episode -------------------------------------------------------------
    def episode_scores(self, ctx: EpisodeContext, question: str, responses: Sequence[str],
                       partial: bool = False) -> Generator[Any, Any, Scores]:
        """Judge ``responses`` to ``question`` within the episode (one yield, all at once)."""
        if not responses:
            return Scores([], 0, [])
        chats = [self.messages(question, r, ctx.reference, partial) for r in responses]
        if self.backend is None:
            judged = yield from self._on_policy(ctx, chats)
        else:
            waits = [AwaitTask(self._asker(chat), timeout=self.timeout, component="verifier",
                               what=f"the judge at {self.where()}") for chat in chats]
            yield waits
            judged = [w.result for w in waits]
        readings = [self.reading(j) for j in judged]
        return Scores([s for s, _ in readings], sum(j.tokens for j in judged), [r for _, r in readings])

    def _asker(self, chat: list[dict[str, str]]) -> Callable[[], Awaitable[Judged]]:
        backend, ask = self.backend, self.ask
        return lambda: backend.complete(chat, ask)

    def _on_policy(self, ctx: EpisodeContext, chats: list[list[dict[str, str]]]) -> Generator[Any, Any, list[Judged]]:
        if ctx.tokenizer is None:
            raise ValueError("a judge on engine: policy needs the episode's tokenizer (ctx.tokenizer) to render "
                             "its prompt")
        sampling = SamplingParams(max_tokens=self.ask.max_tokens, temperature=self.ask.temperature,
                                  top_logprobs=self.ask.top_logprobs)
        tasks: list[GenerationTask] = []
        for i, chat in enumerate(chats):
            _, ids = render_chat(ctx.tokenizer, chat)
            tasks.append(ctx.generation_task(SCORER_INDEX + i, prompt_ids=ids, sampling=sampling, role="judge"))
        yield tasks
        return [judged_from_result(t.need_result(), ctx.tokenizer) for t in tasks]

    async def start(self) -> None:
        if self.backend is not None:
            await self.backend.start()

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()

    def close_private(self) -> None:
        """Stop a private loop the judge's engine was started on by verifier threads (the plugin's run-end hook)."""
        if isinstance(self.backend, EngineBackend):
            self.backend.close_private()

    def __repr__(self) -> str:
        return f"JudgeVerifier(mode={self.mode!r}, where={self.where()!r})"
