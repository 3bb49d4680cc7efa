"""The environment protocol: the other side of a multi-turn conversation.

An environment is registered with the ``register_environments`` hook and
selected by the ``multiturn_chat`` controller's ``environment`` option. It
answers each assistant turn:

* ``reset(ctx) -> state``: called once per conversation with the episode's
  :class:`~scaffold_core.EpisodeContext` (row, reference answer, prompt
  messages, seed). Whatever it returns is that conversation's state; the
  controller keeps it and passes it back to every ``step``. **All
  per-conversation data lives in the state, never on the environment
  object**, which every concurrent episode shares.
* ``step(state, response) -> EnvStep``: ``response`` is the assistant turn's
  text (special tokens removed). It is called after every assistant turn
  except the last one ``max_turns`` allows (that one only the verifier
  scores). Return an :class:`EnvStep`: the messages to
  append (usually one ``user`` message), or ``done``. ``step`` may instead be
  a **generator** that yields lists of runtime tasks (``VerificationTask`` to
  score the response with the run's verifier, ``AwaitTask`` to await a
  coroutine such as a second engine's reply, ``GenerationTask`` on the run's
  engine) and returns the ``EnvStep``; or an ``async def`` (awaited on the
  run's event loop, bounded by the controller's ``environment_timeout``).
* ``start()`` / ``close()`` (optional, async): acquire and release resources
  shared by all conversations (a second engine). The controller calls them
  when the run starts and ends; an environment should also start lazily on
  first use, for callers that never call ``start()``.

Errors raised by an environment fail the episode with component
``environment`` and the reason; they are never turned into a zero reward.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from .errors import EpisodeError
from .generation import AwaitTask
from .verifier import Verdict


class EnvironmentFailure(EpisodeError):
    """An environment failed or broke the protocol; fails its episode with component ``environment``."""

    def __init__(self, message: str):
        super().__init__(message, component="environment")


@dataclass(slots=True)
class EnvStep:
    """An environment's answer to one assistant turn.

    ``messages``: chat messages to append before the model's next turn
    (``[{"role": "user", "content": "..."}]``); ignored when ``done``.
    ``done``: the conversation is over. ``reward``: this turn's reward, if
    the environment scores turns (exposed to trainers as ``turn_rewards``).
    ``verdict``: the run verifier's verdict on this turn's response, when the
    environment already verified it (the controller then does not verify the
    final response again). ``info``: anything else, kept in the episode's
    metadata (must be JSON-serialisable).
    """

    messages: list[dict[str, Any]] | None = None
    done: bool = False
    reward: float | None = None
    verdict: Verdict | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def reply(cls, *contents: str | dict[str, Any], reward: float | None = None, verdict: Verdict | None = None,
              **info: Any) -> EnvStep:
        """Continue the conversation with these messages (a plain string is a ``user`` message)."""
        messages = [{"role": "user", "content": c} if isinstance(c, str) else dict(c) for c in contents]
        return cls(messages=messages, done=False, reward=reward, verdict=verdict, info=info)

    @classmethod
    def finish(cls, *, reward: float | None = None, verdict: Verdict | None = None, **info: Any) -> EnvStep:
        """End the conversation."""
        return cls(messages=None, done=True, reward=reward, verdict=verdict, info=info)


class Environment:
    """Base class of environments (subclassing is optional: the protocol is ``reset``/``step``)."""

    async def start(self) -> None:
        """Acquire resources shared by every conversation (optional)."""

    async def close(self) -> None:
        """Release them. Safe to call twice, and without ``start()``."""

    def reset(self, ctx: Any) -> Any:
        """This conversation's fresh state (default: ``None``)."""
        return None

    def step(self, state: Any, response: str) -> Any:  # pragma: no cover - interface
        """Answer the assistant's ``response``: an :class:`EnvStep` (or a generator / coroutine giving one)."""
        raise NotImplementedError


def check_step(step: Any, name: str) -> EnvStep:
    """``step`` if it is a well-formed :class:`EnvStep`, else an error naming the problem."""
    if not isinstance(step, EnvStep):
        raise EnvironmentFailure(
            f"environment {name!r} returned {type(step).__name__} from step(); return an EnvStep "
            "(EnvStep.reply('...') to continue, EnvStep.finish() to end the conversation)")
    try:
        json.dumps(step.info)
    except (TypeError, ValueError) as exc:
        raise EnvironmentFailure(
            f"environment {name!r} returned info that is not JSON-serialisable ({exc}); it is written to "
            "the run's store as JSON: keep numbers, strings, lists and dicts there") from None
    if step.done:
        return step
    if not step.messages:
        raise EnvironmentFailure(
            f"environment {name!r} neither replied nor ended the conversation: return EnvStep.reply(...) "
            "with at least one message, or EnvStep.finish()")
    for message in step.messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise EnvironmentFailure(
                f"environment {name!r} replied with {message!r}; each message must be a dict with string "
                "'role' and 'content', e.g. {'role': 'user', 'content': 'Try again.'}")
    return step


def run_step(environment: Any, name: str, state: Any, response: str, *,
             timeout: float) -> Generator[Any, Any, EnvStep]:
    """Drive one ``environment.step`` from a controller: ``step = yield from run_step(...)``.

    Handles the three forms of ``step`` (a plain return, a generator yielding
    runtime tasks, a coroutine awaited as an :class:`AwaitTask`); errors raised
    by the environment's own code fail the episode with component
    ``environment``.
    """
    try:
        out = environment.step(state, response)
    except EpisodeError:
        raise
    except Exception as exc:
        raise EnvironmentFailure(f"environment {name!r} raised {type(exc).__name__}: {exc}") from exc
    if inspect.isgenerator(out):
        try:
            out = yield from out
        except EpisodeError:
            raise
        except Exception as exc:
            raise EnvironmentFailure(f"environment {name!r} raised {type(exc).__name__}: {exc}") from exc
    elif inspect.isawaitable(out):
        awaitable = out
        task = AwaitTask(lambda: awaitable, timeout=timeout, component="environment",
                         what=f"environment {name!r} step")
        try:
            yield [task]
        finally:
            if inspect.iscoroutine(awaitable) and task.result is None:
                awaitable.close()  # never awaited (the episode was cancelled first): no 'never awaited' warning
        out = task.result
    return check_step(out, name)
