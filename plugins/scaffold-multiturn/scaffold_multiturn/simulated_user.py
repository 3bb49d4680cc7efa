"""The ``simulated_user`` environment: a second engine-backed model plays the user."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from annotated_types import Gt

from scaffold_core.environment import Environment, EnvStep
from scaffold_core.errors import EngineError, EpisodeError
from scaffold_core.generation import AwaitTask, GenerationRequest, GenerationResult, VerificationTask
from scaffold_core.plugins import Help
from scaffold_core.sampling import SamplingParams, mix_seed
from scaffold_core.tokenizers import render_chat

DEFAULT_INSTRUCTIONS = (
    "You are a student talking to a tutor about this question:\n\n{question}\n\n"
    "Read the tutor's reply. If it fully answers your question, reply with [DONE] and nothing else. "
    "Otherwise ask one short follow-up question."
)


class SimulatedUserEnvironment(Environment):
    """Another model plays the user: it reads each assistant turn and writes the user's next message.

    ``engine`` is an engine section like the run's own (``{name:
    transformers, model: ...}``), built through the registry; the engine is
    started when the run starts (or lazily, on first use) and closed with the
    run. The user model sees ``instructions`` as its system prompt
    (``{question}`` is replaced by the task's last user message), the
    assistant's turns as user messages and its own earlier replies as
    assistant messages. The conversation ends when its reply contains
    ``done_phrase``, or, with ``stop_when_correct``, as soon as the run's
    verifier accepts an assistant turn.
    """

    def __init__(self, engine: dict[str, Any] | None = None, instructions: str = DEFAULT_INSTRUCTIONS,
                 max_tokens: int = 128, temperature: float = 0.7, top_p: float = 1.0,
                 done_phrase: str | None = "[DONE]", stop_when_correct: bool = False,
                 start_timeout: Annotated[float, Gt(0), Help("seconds the user's engine may take to start")] = 900.0,
                 request_timeout: Annotated[float, Gt(0), Help("seconds one reply may take")] = 300.0):
        from scaffold_core.plugins import current_registry

        spec = dict(engine or {"name": "transformers"})
        name = spec.pop("name", None)
        if not isinstance(name, str):
            raise ValueError(f"engine must be an engine section with a name, e.g. {{name: transformers}}; "
                             f"got {engine!r}")
        if done_phrase is not None and not done_phrase.strip():
            raise ValueError("done_phrase must not be empty (null never ends the conversation early)")
        self.engine_name = name
        self.engine = current_registry().create("engine", name, spec, path="controller.environment.engine")
        self.instructions = instructions
        self.sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        self.done_phrase = done_phrase
        self.stop_when_correct = stop_when_correct
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the engine was started on
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Start the user's engine (once; concurrent callers wait for the same start)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError("the simulated user's engine was started on another event loop; close() it first")
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            if self._loop is loop:
                return
            try:
                await asyncio.wait_for(self.engine.start(), self.start_timeout)
            except (asyncio.TimeoutError, TimeoutError):
                raise EngineError(f"the simulated user's engine {self.engine_name!r} did not start within "
                                  f"{self.start_timeout:g} s (start_timeout)", retryable=False) from None
            self._loop = loop

    async def close(self) -> None:
        """Close the user's engine (safe without start, and twice)."""
        self._loop = None
        await self.engine.close()

    # -- conversations -------------------------------------------------------
    def reset(self, ctx: Any) -> dict[str, Any]:
        question = next((m.get("content", "") for m in reversed(ctx.messages or []) if m.get("role") == "user"),
                        str(ctx.row.get("question", "")))
        system = self.instructions.replace("{question}", question)
        return {"messages": [{"role": "system", "content": system}], "turn": 0, "seed": ctx.seed,
                "episode_id": f"{ctx.episode_id}/{ctx.sample_base}", "reference": ctx.reference}

    def step(self, state: dict[str, Any], response: str):
        verdict = None
        if self.stop_when_correct and state["reference"] is not None:
            check = VerificationTask(response, state["reference"])
            yield [check]
            verdict = check.need_verdict()
            if verdict.correct:
                return EnvStep.finish(reward=verdict.reward, verdict=verdict)
        state["messages"].append({"role": "user", "content": response})
        task = AwaitTask(lambda: self._reply(state), timeout=self.request_timeout, component="environment",
                         what=f"the simulated user's engine {self.engine_name!r}")
        yield [task]
        result: GenerationResult = task.result
        reply = result.text.strip()
        state["messages"].append({"role": "assistant", "content": reply})
        state["turn"] += 1
        if self.done_phrase is not None and self.done_phrase in reply:
            return EnvStep.finish(reward=None if verdict is None else verdict.reward, verdict=verdict, user=reply)
        return EnvStep.reply(reply, reward=None if verdict is None else verdict.reward, verdict=verdict)

    async def _reply(self, state: dict[str, Any]) -> GenerationResult:
        await self.start()
        tokenizer = self.engine.tokenizer
        _, ids = render_chat(tokenizer, state["messages"])
        request = GenerationRequest(
            request_id=f"{state['episode_id']}/user/{state['turn']}", prompt_ids=ids, sampling=self.sampling,
            seed=mix_seed(state["seed"], 7919, state["turn"]), episode_id=state["episode_id"])
        try:
            result = await self.engine.generate(request)
            result.check()
        except EpisodeError:
            raise
        except Exception as exc:
            raise EngineError(f"the simulated user's engine {self.engine_name!r} raised {type(exc).__name__}: {exc}",
                              retryable=True) from exc
        if result.finish_reason == "abort":
            raise EngineError(f"the simulated user's engine {self.engine_name!r} aborted a request", retryable=True)
        return result
