"""The episode runtime: one asyncio event loop, bounded concurrency, bounded waits.

* Each episode (each attempt of it) runs on its own clone of the prototype
  controller, made synchronously when it starts, before anything awaits;
  per-episode data travels in its :class:`EpisodeContext`.
* Concurrency is bounded by a fixed number of worker coroutines (no thread per
  request, no task per queued episode): the limits' ``concurrency``.
* Every await is bounded (:class:`~scaffold_core.run.assembly.Limits`): each
  engine request by ``request_timeout``, each verification by the verifier
  pool's timeout, each episode by ``episode_timeout`` (requests and episodes
  share a timer per length: ``scaffold_core.run.deadlines``).
* An error fails its episode with the component and reason (retried up to
  ``retries`` times when the error is retryable); it never becomes a silent
  zero reward and never stops other episodes.
* Each episode records where its time went (``scaffold_core.spans``): its
  engine requests, verifications and awaited calls, as spans on the clock of
  the runtime's start (``record_spans=False``: none).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any

from ..controller import Controller, Parallel
from ..engine import check_constraint
from ..episode import EpisodeContext, EpisodeResult, Outcome, Sample
from ..errors import ControllerError, EngineError, EpisodeError, TrajectoryError, VerifierError
from ..generation import AwaitTask, GenerationRequest, GenerationTask, VerificationTask
from ..plugins.lifecycle import Hooks
from ..spans import CURRENT, META_KEY, add_span, clock, current, relative
from .aio import bounded, gather_or_cancel, gc_threshold, gc_tuned
from .assembly import DEFAULT_LIMITS, Limits
from .deadlines import Deadlines
from .verifier_pool import VerifierPool

#: The phase of an awaited call's span, by the component it names (a judge is part of verifying).
_AWAIT_PHASES = {"tool": "tool", "verifier": "verify"}

log = logging.getLogger("scaffold.runtime")


def verdict_metrics(samples: list[Sample]) -> dict[str, float]:
    """The parts of the samples' rewards (``Verdict.metrics``), each averaged over the samples that have it."""
    sums: dict[str, list[float]] = {}
    for sample in samples:
        for name, value in ((sample.verdict.metrics or {}) if sample.verdict is not None else {}).items():
            sums.setdefault(name, []).append(float(value))
    return {name: sum(values) / len(values) for name, values in sums.items()}


class Runtime:
    """Runs episodes of one controller against one engine and verifier, within ``limits``."""

    def __init__(
        self,
        *,
        engine: Any,
        controller: Controller,
        verifier: VerifierPool | None,
        trajectory_maker: Any = None,
        hooks: Hooks | None = None,
        engine_name: str = "engine",
        limits: Limits = DEFAULT_LIMITS,
        record_spans: bool = True,
        clock_zero: float | None = None,
        traces: Any = None,
        teacher: Any = None,
    ):
        """``record_spans``: record each episode's spans; ``clock_zero``: the :func:`~scaffold_core.spans.clock`
        reading their times count from (default: now); ``traces``: given each finished episode that recorded
        spans (``export(result)``: :class:`~scaffold_core.run.otel.EpisodeTraces`); ``teacher``: a started
        :class:`~scaffold_core.teacher.Teacher` that scores each episode's training sequences (their
        ``teacher_logprobs``, and the store's per-episode ``teacher_kl``), within ``limits.request_timeout``."""
        self.engine = engine
        self.prototype = controller
        self.verifier = verifier
        self.trajectory_maker = trajectory_maker
        self.hooks = hooks or Hooks(None)
        self.engine_name = engine_name
        self.limits = limits
        self.stopping = False
        #: Tokens of every generation returned so far (a live count for the progress: finer than episodes)
        self.returned_tokens = 0
        self.record_spans = record_spans
        self.clock_zero = clock() if clock_zero is None else clock_zero
        self.traces = traces
        self.teacher = teacher
        self._workers: list[asyncio.Future] = []
        self._deadlines = Deadlines()  # request and episode timeouts: one timer per length, not per wait

    # -- running many ---------------------------------------------------
    async def run(
        self,
        contexts: Iterable[EpisodeContext] | AsyncIterable[EpisodeContext],
        on_result: Callable[[EpisodeResult], None] | None = None,
    ) -> int:
        """Run every episode, ``limits.concurrency`` at a time; call ``on_result`` for each as it finishes.
        Returns how many ran."""
        workers = self.limits.concurrency
        if workers is None:
            raise ValueError("Runtime.run needs a bound on the episodes in flight: limits.concurrency is None")
        if hasattr(contexts, "__aiter__"):
            source: Any = contexts.__aiter__()
            is_async = True
        else:
            source = iter(contexts)
            is_async = False
        lock = asyncio.Lock()
        count = 0

        async def next_ctx() -> EpisodeContext | None:
            if self.stopping:
                return None
            if not is_async:
                return next(source, None)
            async with lock:
                try:
                    return await source.__anext__()
                except StopAsyncIteration:
                    return None

        async def worker() -> None:
            nonlocal count
            while True:
                ctx = await next_ctx()
                if ctx is None:
                    return
                result = await self.run_episode(ctx)
                count += 1
                self.hooks.episode_end(result)
                if on_result is not None:
                    on_result(result)

        self._workers = [asyncio.ensure_future(worker()) for _ in range(workers)]
        try:
            with gc_tuned(gc_threshold(workers)):
                outcomes = await asyncio.gather(*self._workers, return_exceptions=True)
        finally:
            for task in self._workers:
                task.cancel()
            self._workers = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                raise outcome
        return count

    def cancel_in_flight(self) -> None:
        """Stop now: cancel every running episode (they are not reported, so a resume redoes them)."""
        self.stopping = True
        for task in self._workers:
            task.cancel()

    # -- one episode ----------------------------------------------------
    def episode_controller(self) -> Controller:
        """The prototype's clone for one episode (a clone that is the prototype itself is refused)."""
        try:
            controller = self.prototype.clone()
        except Exception as exc:
            raise ControllerError(
                f"{type(self.prototype).__name__}.clone() failed: {type(exc).__name__}: {exc}. Objects every "
                "episode may use at once (an engine, a client, anything holding a lock) are shared handles: "
                "name their attributes in the class's `shared` tuple") from exc
        if controller is self.prototype:
            raise ControllerError(f"{type(controller).__name__}.clone() returned the prototype itself: every "
                                  "episode needs its own copy (remove the clone() override)")
        return controller

    async def run_episode(self, ctx: EpisodeContext, *, queued_since: float | None = None) -> EpisodeResult:
        """Run one episode (retried as the limits say); ``queued_since``: when it began waiting for its turn
        (the :func:`~scaffold_core.spans.clock` reading), recorded as its ``queued`` span."""
        if not self.record_spans:
            return await self._run_episode(ctx, None)
        spans: list[tuple[Any, ...]] = []
        if queued_since is not None:
            spans.append(("queued", queued_since, clock()))
        token = CURRENT.set(spans)  # (recording()'s work, without a generator per episode)
        try:
            result = await self._run_episode(ctx, spans)
        finally:
            CURRENT.reset(token)
        if self.traces is not None:
            try:
                self.traces.export(result)
            except Exception as exc:  # the run goes on without them, once said
                log.warning("OpenTelemetry export stopped (%s: %s); the run goes on without it",
                            type(exc).__name__, exc)
                self.traces = None
        return result

    async def _run_episode(self, ctx: EpisodeContext, spans: list[tuple[Any, ...]] | None) -> EpisodeResult:
        started = time.perf_counter()
        attempt = 0
        while True:
            ctx.attempt = attempt
            try:
                controller = self.episode_controller()  # synchronous, before anything awaits
                result = await self._deadlines.bounded(self._attempt(controller, ctx), self.limits.episode_timeout)
                result.attempts = attempt + 1
                result.wall_s = time.perf_counter() - started
                if spans is not None:
                    self._keep_spans(result, spans, started)
                return result
            except asyncio.CancelledError:
                raise
            except (asyncio.TimeoutError, TimeoutError):
                error, component, retryable = (
                    f"episode did not finish within {self.limits.episode_timeout:g} s (rollout.episode_timeout)",
                    "timeout", True)
            except EpisodeError as exc:
                error, component = str(exc), exc.component
                retryable = isinstance(exc, (EngineError, VerifierError)) and getattr(exc, "retryable", True)
            except Exception as exc:  # a bug in a controller or plugin: fail this episode only
                error, component, retryable = f"{type(exc).__name__}: {exc}", "controller", False
            if attempt >= self.limits.retries or not retryable:
                failed = EpisodeResult(
                    episode_id=ctx.episode_id, index=ctx.index, status="failed", reference=ctx.reference,
                    prompt_text=ctx.prompt_text, error=error, error_component=component,
                    attempts=attempt + 1, wall_s=time.perf_counter() - started, row=ctx.row,
                )
                if spans is not None:
                    self._keep_spans(failed, spans, started)
                return failed
            attempt += 1
            ctx.state = {}

    def _keep_spans(self, result: EpisodeResult, spans: list[tuple[Any, ...]], started: float) -> None:
        """The episode's spans (every attempt's) on the result, as seconds since the runtime's start."""
        zero = self.clock_zero
        result.started_s = round(started - zero, 4)
        result.spans = relative(spans, zero)

    async def _attempt(self, controller: Controller, ctx: EpisodeContext) -> EpisodeResult:
        outcome = await self._drive(controller.process(ctx), ctx)
        if not isinstance(outcome, Outcome):
            raise ControllerError(
                f"{type(controller).__name__}.process returned {type(outcome).__name__}; it must return an Outcome"
            )
        samples = [s if isinstance(s, Sample) else Sample.from_task(s) for s in outcome.samples]
        unverified = [s for s in samples if s.verdict is None]
        if unverified and self.verifier is not None:
            began = clock()
            verdicts = await self.verifier.verify_many([(s.text, ctx.reference) for s in unverified])
            add_span("verify", began, clock())
            for sample, verdict in zip(unverified, verdicts):
                sample.verdict = verdict
        result = EpisodeResult(
            episode_id=ctx.episode_id, index=ctx.index, status="ok", reference=ctx.reference,
            prompt_text=ctx.prompt_text if outcome.prompt is None else outcome.prompt, samples=samples,
            chosen=outcome.chosen, answer=outcome.answer,
            answer_reward=outcome.answer_reward, metrics={**verdict_metrics(samples), **outcome.metrics}, row=ctx.row,
        )
        if self.trajectory_maker is not None:
            try:
                result.trajectories = self.trajectory_maker.make(result)
            except Exception as exc:
                raise TrajectoryError(f"trajectory maker raised {type(exc).__name__}: {exc}") from exc
            if self.teacher is not None and result.trajectories:
                await self._score_with_teacher(result)
        return result

    async def _score_with_teacher(self, result: EpisodeResult) -> None:
        """The teacher's logprob of every token of the episode's training sequences, in one batch."""
        from ..teacher import score_samples

        began = clock()
        try:
            await asyncio.wait_for(score_samples(self.teacher, result.trajectories), self.limits.request_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise EpisodeError(f"the teacher did not score the episode within {self.limits.request_timeout:g} s "
                               "(rollout.request_timeout)", component="teacher") from None
        except EpisodeError:
            raise
        except Exception as exc:  # a teacher that fails fails this episode, named as the teacher
            raise EpisodeError(f"teacher: {type(exc).__name__}: {exc}", component="teacher") from exc
        add_span("teacher", began, clock())

    async def _drive(self, gen: Any, ctx: EpisodeContext) -> Any:
        """Step a controller generator, running what it yields."""
        if not hasattr(gen, "send"):
            raise ControllerError(f"process() must be a generator (use yield), got {type(gen).__name__}")
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                item = gen.throw(error) if error is not None else gen.send(send)
            except StopIteration as stop:
                return stop.value
            error = None
            try:
                if isinstance(item, list):
                    await self._run_tasks(item, ctx)
                    send = item
                elif isinstance(item, Parallel):
                    send = await gather_or_cancel(
                        [self._drive(b.controller.process(b.ctx), b.ctx) for b in item.branches])
                else:
                    raise ControllerError(
                        f"controller yielded {type(item).__name__}; yield a list of tasks or a Parallel"
                    )
            except asyncio.CancelledError:
                gen.close()
                raise
            except Exception as exc:  # hand it to the controller, which may handle it
                error = exc

    async def _run_tasks(self, tasks: list[Any], ctx: EpisodeContext) -> None:
        generations = []
        verifications = []
        awaits = []
        for task in tasks:
            if isinstance(task, GenerationTask):
                generations.append(task)
            elif isinstance(task, VerificationTask):
                verifications.append(task)
            elif isinstance(task, AwaitTask):
                awaits.append(task)
            else:
                raise ControllerError(
                    f"cannot run a {type(task).__name__}: yield GenerationTask, VerificationTask or AwaitTask")
        coros = [self._generate(t, ctx) for t in generations]
        if verifications:
            coros.append(self._verify(verifications))
        coros += [self._await(t) for t in awaits]
        if coros:
            await gather_or_cancel(coros)

    async def _await(self, task: AwaitTask) -> None:
        began = clock()
        try:
            task.result = await bounded(task.make(), task.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise EpisodeError(f"{task.what} did not finish within {task.timeout:g} s",
                               component=task.component) from None
        except (EpisodeError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise EpisodeError(f"{task.what} raised {type(exc).__name__}: {exc}", component=task.component) from exc
        finally:
            add_span(_AWAIT_PHASES.get(task.component, "await"), began, clock(), task.what)

    async def _verify(self, tasks: list[VerificationTask]) -> None:
        if self.verifier is None:
            raise VerifierError("the controller asked for verification but this run has no verifier")
        began = clock()
        verdicts = await self.verifier.verify_many([(t.response, t.reference) for t in tasks])
        add_span("verify", began, clock())
        for task, verdict in zip(tasks, verdicts):
            task.verdict = verdict

    async def _generate(self, task: GenerationTask, ctx: EpisodeContext) -> None:
        request = GenerationRequest(
            request_id=task.request_id, prompt_ids=task.prompt_ids, sampling=task.sampling,
            seed=task.seed, episode_id=ctx.episode_id,
        )
        engine = self.engine
        began = clock()
        result = None
        try:
            if self.hooks.has_request_wrappers:
                result = await self.hooks.wrap_request(request, self.engine_name,
                                                       lambda: self._call_engine(engine, request))
            else:
                result = await self._call_engine(engine, request)
        finally:
            spans = current()
            if spans is not None:
                _request_spans(spans, began, clock(), result)
        self.returned_tokens += len(getattr(result, "output_ids", ()) or ())
        task.result = result

    async def _call_engine(self, engine: Any, request: GenerationRequest) -> Any:
        if request.sampling.constraint is not None:
            check_constraint(engine, request.sampling, self.engine_name)
        try:
            result = await self._deadlines.bounded(engine.generate(request), self.limits.request_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise EngineError(
                f"engine {self.engine_name!r} did not answer request {request.request_id} within "
                f"{self.limits.request_timeout:g} s (rollout.request_timeout)", retryable=True) from None
        except EpisodeError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EngineError(f"engine {self.engine_name!r} raised {type(exc).__name__}: {exc}",
                              retryable=True) from exc
        try:
            result.check()
        except (ValueError, AttributeError) as exc:
            raise EngineError(f"engine {self.engine_name!r} returned a malformed result: {exc}",
                              retryable=False) from exc
        if result.finish_reason == "abort":
            raise EngineError(
                f"engine {self.engine_name!r} aborted request {request.request_id}"
                + (f": {result.meta.get('message')}" if result.meta.get("message") else ""), retryable=True)
        return result


def _request_spans(spans: list[tuple[Any, ...]], began: float, ended: float, result: Any) -> None:
    """One engine request's spans: those the engine reported in its result's meta (see scaffold_core.spans),
    else one ``generate`` span over the whole request."""
    reported = getattr(result, "meta", None)
    reported = reported.get(META_KEY) if isinstance(reported, dict) else None
    if isinstance(reported, list) and reported:
        try:
            parts = [(str(phase), max(float(start), began), min(float(end), ended)) for phase, start, end in reported]
        except (TypeError, ValueError):  # not (phase, start, end) triples: the request as one span
            parts = []
        if parts:
            spans.extend(parts)
            return
    spans.append(("generate", began, ended))
