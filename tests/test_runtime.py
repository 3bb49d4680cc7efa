"""The runtime: episode isolation, failures that never hang or hide, controllers, hooks."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from scaffold_testkit import ListTask, ScriptedEngine, make_contexts, plugin_set, run_episodes

from scaffold_core import hookimpl
from scaffold_core.builtins.controllers import BestOfNController, MajorityVoteController, NativeController
from scaffold_core.builtins.trajectories import GRPOTrajectoryMaker, SingleTurnTrajectoryMaker
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.controller import Controller
from scaffold_core.episode import Outcome
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationResult, VerificationTask
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.verifier import Verdict, Verifier


def question_of(prompt: str) -> str:
    """The user message of a ByteTokenizer-rendered prompt."""
    return prompt.split("<|user|>\n", 1)[1].split("<|end|>", 1)[0]


def echo_answer(prompt: str, request) -> str:
    """Answers 'Q<n>' with '<n>' so every response can be traced to its own prompt."""
    return question_of(prompt).split("Q", 1)[1]


def rows(n: int) -> list[dict]:
    return [{"id": f"ep{i}", "question": f"Q{i}", "answer": str(i)} for i in range(n)]


class StatefulController(Controller):
    """Keeps per-episode state on self across several awaits: any sharing between episodes shows."""

    def __init__(self):
        self.seen: list[str] = []

    def process(self, ctx):
        self.seen.append(ctx.episode_id)
        first = ctx.generation_task(0)
        yield [first]
        self.seen.append(first.text)
        second = ctx.generation_task(1)
        yield [second]
        self.seen.append(second.text)
        assert self.seen == [ctx.episode_id, first.text, second.text], self.seen
        return Outcome(samples=[first, second], metrics={"state_len": float(len(self.seen))})


def test_isolation_2000_concurrent_episodes_with_random_delays():
    task = ListTask(rows(2000))
    engine = ScriptedEngine(echo_answer, delay=(0.0, 0.02), seed=7)
    contexts = make_contexts(task, engine.tokenizer)
    prototype = StatefulController()
    results = run_episodes(contexts, engine=engine, controller=prototype, verifier=ExactMatchVerifier(),
                           trajectory_maker=SingleTurnTrajectoryMaker(), concurrency=2000, timeout=300)
    assert len(results) == 2000
    assert prototype.seen == []  # the prototype itself never ran an episode
    leaks = 0
    for ctx, result in zip(contexts, results):
        assert result.ok, result.error
        number = ctx.episode_id[2:]
        for sample in result.samples:
            leaks += sample.text != number or result.reference != number
            leaks += engine.tokenizer.decode(sample.prompt_ids) != ctx.prompt_text
        leaks += result.metrics["state_len"] != 3.0
        leaks += any(t.episode_id != ctx.episode_id for t in result.trajectories)
        leaks += any(t.reward != 1.0 for t in result.trajectories)
    assert leaks == 0


class RecordingNative(NativeController):
    instances: list = []

    def process(self, ctx):
        RecordingNative.instances.append((ctx.episode_id, self))
        return (yield from super().process(ctx))


def test_majority_vote_branches_never_share_a_sub_controller():
    RecordingNative.instances = []
    task = ListTask(rows(50))
    engine = ScriptedEngine(echo_answer, delay=(0.0, 0.005))
    prototype = MajorityVoteController(samples=4, generator=RecordingNative())
    results = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=prototype,
                           verifier=ExactMatchVerifier(), concurrency=50)
    assert all(r.ok for r in results)
    objects = [obj for _, obj in RecordingNative.instances]
    assert len(objects) == 200
    assert len({id(o) for o in objects}) == 200  # all alive (held in the list), all distinct
    assert prototype.generator not in objects


def test_majority_vote_keeps_every_sample_and_votes_on_extracted_answers():
    answers = iter(["7", "8", "7", "x"] * 10)
    lock = threading.Lock()

    def respond(prompt, request):
        with lock:
            return next(answers)

    task = ListTask([{"id": "a", "question": "Q", "answer": "7"}])
    engine = ScriptedEngine(respond)
    result = run_episodes(make_contexts(task, engine.tokenizer), engine=engine,
                          controller=MajorityVoteController(samples=4), verifier=ExactMatchVerifier(),
                          trajectory_maker=SingleTurnTrajectoryMaker())[0]
    assert len(result.samples) == 4 and len(result.trajectories) == 4
    assert sorted(s.text for s in result.samples) == ["7", "7", "8", "x"]
    assert result.answer == "7" and result.metrics == {"maj@4": 1.0}
    assert sorted(t.reward for t in result.trajectories) == [0.0, 0.0, 1.0, 1.0]
    assert sorted(s.sample_index for s in result.samples) == [0, 1, 2, 3]


def test_best_of_n_chooses_the_best_sample_and_keeps_all():
    answers = iter(["1", "2", "3"])
    task = ListTask([{"id": "a", "question": "Q", "answer": "2"}])
    engine = ScriptedEngine(lambda p, r: next(answers))
    result = run_episodes(make_contexts(task, engine.tokenizer), engine=engine,
                          controller=BestOfNController(samples=3), verifier=ExactMatchVerifier(), concurrency=1)[0]
    assert len(result.samples) == 3
    assert result.samples[result.chosen].text == "2" and result.answer_reward == 1.0


class _JudgeLike(Verifier):
    """Scores "good" 1.0 and "bad" 0.0; anything else it cannot score (an unscored verdict)."""

    def verify(self, response, reference):
        if response in ("good", "bad"):
            return Verdict(float(response == "good"), response)
        return Verdict.unscored("malformed judgement")


def test_an_unscored_verdict_is_no_reward_never_zero_and_best_of_n_ranks_it_last():
    from scaffold_core.run.metrics import RunMetrics, episode_correct

    answers = iter(["??", "bad", "??"])
    task = ListTask([{"id": "a", "question": "Q", "answer": "x"}])
    engine = ScriptedEngine(lambda p, r: next(answers))
    result = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=BestOfNController(samples=3),
                          verifier=_JudgeLike(), trajectory_maker=SingleTurnTrajectoryMaker(), concurrency=1)[0]
    assert result.ok, result.error
    assert result.samples[result.chosen].text == "bad"  # a scored 0.0 beats the unscored samples
    unscored = [s for s in result.samples if s.text == "??"]
    assert all(not s.verdict.scored and s.reward != s.reward for s in unscored)  # NaN: no reward
    assert [t.reward for t in result.trajectories] == [0.0]  # unscored samples are left out, not scored 0.0
    metrics = RunMetrics()
    metrics.add(result)
    assert metrics.summary()["unscored_samples"] == 2
    result.chosen, result.answer_reward = None, float("nan")
    assert episode_correct(result) is None  # an unscored answer is neither right nor wrong


def test_check_verdict_lets_only_explicit_unscored_verdicts_through():
    from scaffold_core.errors import InvalidVerdictError
    from scaffold_core.verifier import check_verdict

    verdict = Verdict.unscored("could not parse", extracted="garbage")
    assert check_verdict(_JudgeLike(), verdict) is verdict and verdict.reward != verdict.reward
    with pytest.raises(InvalidVerdictError):
        check_verdict(_JudgeLike(), Verdict(float("nan")))  # a NaN reward by accident still fails


def test_failures_are_counted_with_reasons_and_never_hang():
    def fail(prompt):
        return question_of(prompt) in {"Q1", "Q5"}

    def hang(prompt):
        return question_of(prompt) in {"Q2", "Q6"}

    class SlowOnSeven(Verifier):
        def verify(self, response, reference):
            if response == "7":
                time.sleep(3)
            return ExactMatchVerifier().verify(response, reference)

    task = ListTask(rows(10))
    engine = ScriptedEngine(echo_answer, fail=fail, hang=hang)
    start = time.perf_counter()
    results = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=NativeController(),
                           verifier=SlowOnSeven(), verifier_timeout=0.5, request_timeout=0.5, timeout=60)
    assert time.perf_counter() - start < 20
    by_id = {r.episode_id: r for r in results}
    assert len(by_id) == 10
    for eid in ("ep1", "ep5"):
        assert by_id[eid].status == "failed" and by_id[eid].error_component == "engine"
        assert "injected engine failure" in by_id[eid].error
    for eid in ("ep2", "ep6"):
        assert by_id[eid].error_component == "engine" and "within 0.5 s" in by_id[eid].error
    assert by_id["ep7"].error_component == "verifier" and "did not finish within 0.5 s" in by_id["ep7"].error
    ok = [r for r in results if r.ok]
    assert {r.episode_id for r in ok} == {"ep0", "ep3", "ep4", "ep8", "ep9"}
    assert all(r.samples[0].reward == 1.0 for r in ok)
    assert all(not r.samples for r in results if not r.ok)  # a failure never becomes a zero-reward sample


def test_retries_rerun_a_failed_episode_on_a_fresh_clone():
    calls: dict[str, int] = {}

    def fail_once(prompt):
        q = question_of(prompt)
        calls[q] = calls.get(q, 0) + 1
        return q == "Q3" and calls[q] == 1

    task = ListTask(rows(5))
    engine = ScriptedEngine(echo_answer, fail=fail_once)
    results = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=StatefulController(),
                           verifier=ExactMatchVerifier(), retries=1)
    assert all(r.ok for r in results)
    assert {r.episode_id: r.attempts for r in results}["ep3"] == 2
    assert all(r.metrics["state_len"] == 3.0 for r in results)


class FallbackController(Controller):
    """Handles an engine error thrown back at its yield."""

    def process(self, ctx):
        task = ctx.generation_task(0)
        try:
            yield [task]
        except EngineError:
            task = ctx.generation_task(1, prompt_ids=ctx.prompt_ids[:-1])
            yield [task]
        return Outcome(samples=[task])


def test_engine_errors_are_thrown_into_the_controller_which_may_recover():
    seen = []

    def fail_first(prompt):
        seen.append(prompt)
        return len(seen) == 1

    task = ListTask(rows(1))
    engine = ScriptedEngine("0", fail=fail_first)
    result = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=FallbackController(),
                          verifier=ExactMatchVerifier())[0]
    assert result.ok and result.samples[0].sample_index == 1


class BadYield(Controller):
    def process(self, ctx):
        yield "not a task list"
        return Outcome(samples=[])


class NoOutcome(Controller):
    def process(self, ctx):
        yield []
        return None


def test_controller_bugs_fail_their_episode_with_a_reason():
    engine = ScriptedEngine()
    ctxs = make_contexts(ListTask(rows(2)), engine.tokenizer)
    bad = run_episodes(ctxs, engine=engine, controller=BadYield(), verifier=ExactMatchVerifier())
    assert all(r.error_component == "controller" and "yield a list of tasks" in r.error for r in bad)
    engine = ScriptedEngine()
    none = run_episodes(ctxs, engine=engine, controller=NoOutcome(), verifier=ExactMatchVerifier())
    assert all("must return an Outcome" in r.error for r in none)


class MalformedEngine(ScriptedEngine):
    async def generate(self, request):
        return GenerationResult([1, 2, 3], [0.0], "stop", "x")


class MisversionedEngine(ScriptedEngine):
    async def generate(self, request):
        return GenerationResult([1, 2, 3], [0.0] * 3, "stop", "x", 2, versions=[2, 3])


class AbortingEngine(ScriptedEngine):
    async def generate(self, request):
        return GenerationResult([], [], "abort", "", meta={"message": "paused for a weight update"})


def test_malformed_and_aborted_engine_results_fail_the_episode():
    ctxs = make_contexts(ListTask(rows(1)), MalformedEngine().tokenizer)
    r = run_episodes(ctxs, engine=MalformedEngine(), controller=NativeController(), verifier=ExactMatchVerifier())[0]
    assert r.error_component == "engine" and "3 output ids but 1 logprobs" in r.error
    r = run_episodes(ctxs, engine=MisversionedEngine(), controller=NativeController(),
                     verifier=ExactMatchVerifier())[0]
    assert r.error_component == "engine" and "3 output ids but 2 versions" in r.error
    r = run_episodes(ctxs, engine=AbortingEngine(), controller=NativeController(), verifier=ExactMatchVerifier(),
                     retries=2)[0]
    assert r.error_component == "engine" and "aborted" in r.error and "weight update" in r.error
    assert r.attempts == 3


class VerifyInController(Controller):
    def process(self, ctx):
        gen = ctx.generation_task(0)
        yield [gen]
        check = VerificationTask(gen.text, ctx.reference)
        yield [check]
        gen.verdict = Verdict(check.verdict.reward * 10, check.verdict.extracted)
        return Outcome(samples=[gen])


def test_verification_tasks_and_controller_verdicts_are_kept():
    engine = ScriptedEngine(echo_answer)
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine,
                          controller=VerifyInController(), verifier=ExactMatchVerifier())[0]
    assert result.samples[0].reward == 10.0  # not re-verified by the runtime


def test_grpo_advantages_are_normalised_within_each_group():
    answers = iter(["1", "0", "0", "0"])
    engine = ScriptedEngine(lambda p, r: next(answers))
    result = run_episodes(make_contexts(ListTask([{"id": "g", "question": "Q", "answer": "1"}]), engine.tokenizer),
                          engine=engine, controller=NativeController(samples=4), verifier=ExactMatchVerifier(),
                          trajectory_maker=GRPOTrajectoryMaker(), concurrency=1)[0]
    adv = sorted(t.advantage for t in result.trajectories)
    # rewards [1, 0, 0, 0]: mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5 (AReaL's default), eps 1e-5
    assert adv == pytest.approx([-0.25 / 0.50001] * 3 + [0.75 / 0.50001], rel=1e-9)
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert all(t.group_id == "g" for t in result.trajectories)


def test_trajectories_are_token_faithful():
    engine = ScriptedEngine(echo_answer)
    ctx = make_contexts(ListTask(rows(1)), engine.tokenizer)[0]
    result = run_episodes([ctx], engine=engine, controller=NativeController(), verifier=ExactMatchVerifier(),
                          trajectory_maker=SingleTurnTrajectoryMaker())[0]
    t = result.trajectories[0]
    request = engine.requests[0]
    sampled = engine.result_for("0", request)
    assert t.input_ids == ctx.prompt_ids + sampled.output_ids
    assert t.loss_mask == [0] * len(ctx.prompt_ids) + [1] * len(sampled.output_ids)
    assert t.logprobs == [0.0] * len(ctx.prompt_ids) + sampled.logprobs
    assert t.versions == [-1] * len(ctx.prompt_ids) + [0] * len(sampled.output_ids)
    assert t.prompt_len == len(ctx.prompt_ids)


class Observer:
    def __init__(self):
        self.ended = []
        self.requests = []

    @hookimpl
    def on_episode_end(self, result):
        self.ended.append(result.episode_id)

    @hookimpl(wrapper=True)
    def engine_request(self, request, engine):
        self.requests.append(request.request_id)
        result = yield
        result.meta["traced_by"] = "observer"
        return result


class BrokenObserver:
    @hookimpl
    def on_episode_end(self, result):
        raise ValueError("observer bug")


class BrokenWrapper:
    @hookimpl(wrapper=True)
    def engine_request(self, request):
        raise RuntimeError("tracer bug")
        yield


def _run_with_hooks(**plugins):
    ps = plugin_set(**plugins)
    engine = ScriptedEngine(echo_answer)
    hooks = Hooks(ps.pm)
    results = run_episodes(make_contexts(ListTask(rows(3)), engine.tokenizer), engine=engine,
                           controller=NativeController(), verifier=ExactMatchVerifier(), hooks=hooks)
    return results, hooks


def test_lifecycle_hooks_observe_episodes_and_wrap_requests(caplog):
    observer = Observer()
    results, hooks = _run_with_hooks(observer=observer, broken=BrokenObserver())
    assert all(r.ok for r in results)
    assert sorted(observer.ended) == ["ep0", "ep1", "ep2"]
    assert len(observer.requests) == 3
    assert hooks.errors["broken"] == 3  # counted, logged once, and other plugins unaffected
    assert "plugin 'broken' raised in on_episode_end" in caplog.text


def test_a_raising_request_wrapper_fails_the_episode_naming_the_plugin():
    results, _ = _run_with_hooks(tracer=BrokenWrapper())
    assert all(r.status == "failed" for r in results)
    assert all(r.error_component == "plugin:tracer" and "tracer bug" in r.error for r in results)


def test_non_wrapper_engine_request_impl_is_rejected_at_load():
    class NotAWrapper:
        @hookimpl
        def engine_request(self, request):
            return None

    ps = plugin_set(bad=NotAWrapper())
    info = {i.name: i for i in ps.plugin_infos()}["bad"]
    assert info.status == "error" and "wrapper=True" in info.error


def test_concurrency_is_bounded():
    in_flight = 0
    peak = 0

    class Counting(ScriptedEngine):
        async def generate(self, request):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.001 * random.random())
            in_flight -= 1
            return await super().generate(request)

    engine = Counting(echo_answer)
    results = run_episodes(make_contexts(ListTask(rows(200)), engine.tokenizer), engine=engine,
                           controller=NativeController(), verifier=ExactMatchVerifier(), concurrency=16)
    assert len(results) == 200 and peak <= 16


class AwaitingController(Controller):
    """Awaits a coroutine between two generations (what a multi-turn environment backed by a second engine does)."""

    def __init__(self, make, timeout=1.0, catch=False):
        self.make, self.timeout, self.catch = make, timeout, catch

    def process(self, ctx):
        from scaffold_core.errors import EpisodeError
        from scaffold_core.generation import AwaitTask

        first = ctx.generation_task(0)
        call = AwaitTask(lambda: self.make(ctx), timeout=self.timeout, component="environment", what="the tool")
        try:
            yield [first, call]
        except EpisodeError as exc:
            if not self.catch:
                raise
            return Outcome(samples=[], metrics={"caught": float("the tool raised ValueError: tool down" in str(exc))})
        return Outcome(samples=[first], metrics={"awaited": float(call.result)})


def test_await_tasks_run_on_the_loop_alongside_generations():
    async def tool(ctx):
        await asyncio.sleep(0.01)
        return int(ctx.episode_id[2:]) * 2

    engine = ScriptedEngine(echo_answer)
    results = run_episodes(make_contexts(ListTask(rows(20)), engine.tokenizer), engine=engine,
                           controller=AwaitingController(tool), verifier=ExactMatchVerifier(), concurrency=20)
    assert [r.metrics["awaited"] for r in results] == [2.0 * i for i in range(20)]
    assert all(r.ok and r.samples[0].reward == 1.0 for r in results)


@pytest.mark.parametrize("make, match", [
    (lambda ctx: asyncio.Event().wait(), "the tool did not finish within 0.05 s"),
    (lambda ctx: asyncio.sleep(0, result=1 / 0), None),  # raises while building the awaitable
])
def test_a_failing_or_hanging_await_task_fails_the_episode_with_its_component(make, match):
    engine = ScriptedEngine(echo_answer)
    started = time.perf_counter()
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine,
                          controller=AwaitingController(make, timeout=0.05), verifier=ExactMatchVerifier())[0]
    assert time.perf_counter() - started < 10
    assert result.status == "failed" and result.error_component == "environment"
    assert match is None or match in result.error


def test_an_await_task_error_is_thrown_into_the_controller():
    async def broken(ctx):
        raise ValueError("tool down")

    engine = ScriptedEngine(echo_answer)
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine,
                          controller=AwaitingController(broken, catch=True), verifier=ExactMatchVerifier())[0]
    assert result.ok and result.metrics["caught"] == 1.0


class LifecycleController(NativeController):
    """Records start/close calls and the event loop they ran on."""

    calls: list = []

    async def start(self):
        LifecycleController.calls.append(("start", id(asyncio.get_running_loop())))

    async def close(self):
        LifecycleController.calls.append(("close", id(asyncio.get_running_loop())))


def test_run_episodes_starts_and_closes_the_controller_once_on_the_runs_loop():
    LifecycleController.calls = []
    engine = ScriptedEngine(echo_answer)
    results = run_episodes(make_contexts(ListTask(rows(5)), engine.tokenizer), engine=engine,
                           controller=LifecycleController(), verifier=ExactMatchVerifier())
    assert all(r.ok for r in results)
    assert [c[0] for c in LifecycleController.calls] == ["start", "close"]
    assert LifecycleController.calls[0][1] == LifecycleController.calls[1][1]


def test_majority_vote_passes_start_and_close_to_its_generator():
    LifecycleController.calls = []
    engine = ScriptedEngine(echo_answer)
    run_episodes(make_contexts(ListTask(rows(2)), engine.tokenizer), engine=engine,
                 controller=MajorityVoteController(samples=2, generator=LifecycleController()),
                 verifier=ExactMatchVerifier())
    assert [c[0] for c in LifecycleController.calls] == ["start", "close"]


class ManySteps(Controller):
    def process(self, ctx):
        tasks = []
        for i in range(60):  # 6 s of engine calls at 0.1 s each, unless the episode is cut
            task = ctx.generation_task(i)
            yield [task]
            tasks.append(task)
        return Outcome(samples=tasks)


def test_an_episode_past_episode_timeout_fails_as_timeout():
    engine = ScriptedEngine(echo_answer, delay=0.1)
    start = time.perf_counter()
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine, controller=ManySteps(),
                          verifier=ExactMatchVerifier(), episode_timeout=0.5, request_timeout=5.0)[0]
    assert time.perf_counter() - start < 4.0  # cut near 0.5 s (the margin is for a loaded machine)
    assert result.status == "failed" and result.error_component == "timeout"
    assert "0.5 s (rollout.episode_timeout)" in result.error and not result.samples


# -- isolation by construction ----------------------------------------------------


class SeenAnswers(NativeController):
    """A user's subclass: adds mutable state and overrides nothing (no clone)."""

    def __init__(self, samples: int = 1):
        super().__init__(samples)
        self.seen: list[str] = []
        self.cache: dict[str, list[str]] = {"answers": []}

    def process(self, ctx):
        self.seen.append(ctx.episode_id)
        self.cache["answers"].append(ctx.episode_id)
        outcome = yield from super().process(ctx)
        others = {e for e in self.seen + self.cache["answers"] if e != ctx.episode_id}
        outcome.metrics["others_seen"] = float(len(others))
        return outcome


def test_a_subclass_adding_mutable_state_is_isolated_without_overriding_clone():
    task = ListTask(rows(400))
    engine = ScriptedEngine(echo_answer, delay=(0.0, 0.01), seed=3)
    prototype = SeenAnswers()
    results = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=prototype,
                           verifier=ExactMatchVerifier(), concurrency=400, timeout=300)
    assert all(r.ok for r in results)
    assert sum(r.metrics["others_seen"] > 0 for r in results) == 0  # 400 concurrent episodes, no leak
    assert prototype.seen == [] and prototype.cache == {"answers": []}


class Handle:
    """Something every episode may share (a client, an environment): it must not be copied."""

    def __init__(self):
        self.lock = threading.Lock()  # cannot be deep-copied


class WithHandle(NativeController):
    shared = ("handle",)

    def __init__(self):
        super().__init__(2)
        self.handle = Handle()
        self.table = {"nested": [1, 2]}
        self.frozen = ("a", 1, (2.0, None))
        self.sub = NativeController(3)


class MoreHandles(WithHandle):
    shared = ("other",)

    def __init__(self):
        super().__init__()
        self.other = Handle()
        self.refs = [self.handle, self.other, {"h": self.handle}]


def test_clone_copies_everything_but_declared_shared_handles_and_immutables():
    proto = WithHandle()
    twin = proto.clone()
    assert type(twin) is WithHandle and twin is not proto
    assert twin.handle is proto.handle  # declared shared
    assert twin.table == proto.table and twin.table is not proto.table
    assert twin.table["nested"] is not proto.table["nested"]
    assert twin.frozen is proto.frozen  # immutable: a copy would be equal
    assert type(twin.sub) is NativeController and twin.sub is not proto.sub and twin.sub.samples == 3
    # Declarations add up along the hierarchy, and a handle stays shared wherever it is referred to.
    more = MoreHandles()
    copy_ = more.clone()
    assert copy_.handle is more.handle and copy_.other is more.other
    assert copy_.refs is not more.refs and copy_.refs[0] is more.handle and copy_.refs[2]["h"] is more.handle


def test_shared_must_be_a_tuple_of_names():
    class Bad(NativeController):
        shared = "handle"

    with pytest.raises(TypeError, match=r"Bad.shared must be a tuple of attribute names"):
        Bad().clone()


class KeepsALock(NativeController):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()  # not declared shared: cannot be copied


class CustomState(NativeController):
    """Drops a cache when copied, through the pickling protocol."""

    def __init__(self):
        super().__init__()
        self.cache = {"x": 1}
        self.log: list[str] = []

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "cache"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.cache = {}


class Slotted(Controller):
    __slots__ = ("history", "samples")

    def __init__(self):
        self.history: list[str] = []
        self.samples = 1

    def process(self, ctx):
        self.history.append(ctx.episode_id)
        task = ctx.generation_task(0)
        yield [task]
        return Outcome(samples=[task], metrics={"history": float(len(self.history))})


def test_clone_honours_pickling_rules_and_slots():
    proto = CustomState()
    proto.log.append("x")
    twin = proto.clone()
    assert twin.cache == {} and twin.log == ["x"] and twin.log is not proto.log
    slotted = Slotted()
    copy_ = slotted.clone()
    assert copy_.history == [] and copy_.history is not slotted.history and copy_.samples == 1
    engine = ScriptedEngine(echo_answer, delay=(0.0, 0.002))
    results = run_episodes(make_contexts(ListTask(rows(30)), engine.tokenizer), engine=engine, controller=slotted,
                           concurrency=30)
    assert [r.metrics["history"] for r in results] == [1.0] * 30 and slotted.history == []


class ReturnsItself(NativeController):
    def clone(self):
        return self


def test_a_clone_that_cannot_be_made_or_is_the_prototype_fails_the_episode_with_the_fix():
    engine = ScriptedEngine(echo_answer)
    results = run_episodes(make_contexts(ListTask(rows(2)), engine.tokenizer), engine=engine,
                           controller=KeepsALock())
    assert [r.status for r in results] == ["failed", "failed"]
    assert results[0].error_component == "controller"
    assert "KeepsALock.clone() failed" in results[0].error and "`shared` tuple" in results[0].error
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine,
                          controller=ReturnsItself())[0]
    assert result.status == "failed" and "returned the prototype itself" in result.error


def test_the_builtin_controllers_do_not_override_clone():
    for cls in (NativeController, MajorityVoteController, BestOfNController):
        assert "clone" not in {k for klass in cls.__mro__ if klass is not Controller for k in vars(klass)}, cls


# -- copy-on-branch ----------------------------------------------------------------


def test_branch_contexts_get_their_own_copies_of_everything_mutable():
    engine = ScriptedEngine()
    rows_ = [{"id": "b", "question": "Q1", "answer": "1", "meta": {"tags": ["x"]}}]
    ctx = make_contexts(ListTask(rows_), engine.tokenizer)[0]
    ctx.state["notes"] = {"seen": [1]}
    first, second = ctx.branch(0), ctx.branch(1)
    first.row["meta"]["tags"].append("first")
    first.row["edited"] = True
    first.messages.append({"role": "assistant", "content": "mine"})
    first.messages[0]["content"] = "changed"
    first.state["notes"]["seen"].append(2)
    assert second.row == rows_[0] and ctx.row == rows_[0] and ctx.row["meta"]["tags"] == ["x"]
    assert second.messages == ctx.messages and len(ctx.messages) == len(second.messages) == 1
    assert ctx.messages[0]["content"] == "Q1"
    assert ctx.state["notes"] == {"seen": [1]} and second.state["notes"] == {"seen": [1]}
    assert first.state["notes"] == {"seen": [1, 2]}  # a branch starts from a copy of its parent's state
    assert second.tokenizer is ctx.tokenizer and second.sampling is ctx.sampling  # shared: immutable / a handle
    assert second.prompt_ids is ctx.prompt_ids  # shared and read-only: every task and sample refers to it
    assert (first.sample_base, second.sample_base) == (0, 1)


def test_branch_copies_keep_shared_references_and_cycles():
    from scaffold_core._cloning import copy_data

    shared = [1]
    data = {"a": shared, "b": shared, "t": (1, [2])}
    data["self"] = data
    copied = copy_data(data)
    assert copied["a"] is copied["b"] and copied["a"] is not shared
    assert copied["self"] is copied and copied["t"] == (1, [2]) and copied["t"][1] is not data["t"][1]


def test_a_branch_with_uncopyable_state_fails_its_episode_with_the_fix():
    class Brancher(Controller):
        def process(self, ctx):
            ctx.state["lock"] = threading.Lock()
            outcomes = yield self.parallel(NativeController(), [ctx.branch(0)])
            return outcomes[0]

    engine = ScriptedEngine(echo_answer)
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine,
                          controller=Brancher())[0]
    assert result.status == "failed" and "keep shared handles on the controller" in result.error


# -- missing rewards -----------------------------------------------------------------


def _episode(rewards):
    from scaffold_core.episode import EpisodeResult, Sample

    samples = [Sample(prompt_ids=[1, 2], output_ids=[3 + i], output_logprobs=[-0.5], output_mask=[1], text=str(i),
                      finish_reason="stop", sample_index=i,
                      verdict=None if r is None else Verdict(r, str(r)))
               for i, r in enumerate(rewards)]
    return EpisodeResult(episode_id="e", index=0, status="ok", samples=samples)


@pytest.mark.parametrize("maker", [SingleTurnTrajectoryMaker(), GRPOTrajectoryMaker()])
def test_a_sample_without_a_reward_is_dropped_never_scored_zero(maker):
    made = maker.make(_episode([1.0, None, 0.0, float("nan")]))
    assert [t.sample_index for t in made] == [0, 2]
    assert [t.reward for t in made] == [1.0, 0.0]  # 0.0 stays 0.0


@pytest.mark.parametrize("maker", [SingleTurnTrajectoryMaker(missing_reward="fail"),
                                   GRPOTrajectoryMaker(missing_reward="fail")])
def test_missing_reward_fail_fails_the_episode(maker):
    from scaffold_core.trajectory import MissingRewardError

    with pytest.raises(MissingRewardError, match="sample 1 of episode e has no reward.*missing_reward: drop"):
        maker.make(_episode([1.0, None]))
    assert len(maker.make(_episode([1.0, 0.0]))) == 2


def test_unverified_samples_in_a_run_are_counted_and_follow_the_policy():
    from scaffold_core.run.metrics import RunMetrics, unscored_warning

    engine = ScriptedEngine(echo_answer)
    contexts = make_contexts(ListTask(rows(3)), engine.tokenizer)
    dropped = run_episodes(contexts, engine=engine, controller=NativeController(samples=2), verifier=None,
                           trajectory_maker=SingleTurnTrajectoryMaker())
    assert all(r.ok and r.trajectories == [] for r in dropped)
    metrics = RunMetrics()
    for result in dropped:
        metrics.add(result)
    summary = metrics.summary()
    assert summary["unscored_samples"] == 6 and summary["samples"] == 6
    assert summary["reward_mean"] == 0.0 and summary["accuracy"] == 0.0 and "pass@2" not in summary
    assert "6 of 6 sample(s) have no reward" in unscored_warning(summary)
    failed = run_episodes(make_contexts(ListTask(rows(3)), engine.tokenizer), engine=engine,
                          controller=NativeController(), verifier=None,
                          trajectory_maker=GRPOTrajectoryMaker(missing_reward="fail"))
    assert [r.status for r in failed] == ["failed"] * 3
    assert failed[0].error_component == "trajectory" and "has no reward" in failed[0].error


def test_metrics_leave_unscored_samples_out_of_means_but_keep_zero_rewards():
    from scaffold_core.run.metrics import RunMetrics, unscored_warning

    metrics = RunMetrics()
    metrics.add(_episode([1.0, None, 0.0]))
    metrics.add(_episode([0.0, 0.0]))
    summary = metrics.summary()
    assert summary["unscored_samples"] == 1 and summary["samples"] == 5
    assert summary["reward_mean"] == pytest.approx(1.0 / 4)  # over the 4 scored samples
    assert summary["accuracy"] == pytest.approx((1 / 2 + 0.0) / 2)  # fractions over scored samples
    assert summary["pass@3"] == 1.0 and summary["pass@2"] == 0.0
    healthy = RunMetrics()
    healthy.add(_episode([0.0]))
    assert healthy.summary()["unscored_samples"] == 0 and unscored_warning(healthy.summary()) is None


# -- advantages ----------------------------------------------------------------------


UNBIASED_1001 = 0.5 / (3 ** -0.5 + 1e-5)  # rewards [1, 0, 0, 1]: (1 - 0.5) / (sqrt(1 / 3) + eps)


@pytest.mark.parametrize("rewards, options, expected", [
    # mean 0.5; unbiased std sqrt(1/3); population std 0.5
    ([1, 0, 0, 1], {}, [UNBIASED_1001, -UNBIASED_1001, -UNBIASED_1001, UNBIASED_1001]),
    ([1, 0, 0, 1], {"std": "population"}, [0.5 / 0.50001, -0.5 / 0.50001, -0.5 / 0.50001, 0.5 / 0.50001]),
    ([1, 0, 0, 1], {"std": "none"}, [0.5, -0.5, -0.5, 0.5]),
    ([1, 0, 0, 1], {"std": "none", "baseline": "leave_one_out"}, [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
    # leave-one-out baselines [1.5, 2, 2.5]; unbiased std of [3, 2, 1] is 1
    ([3, 2, 1], {"baseline": "leave_one_out", "eps": 0.0}, [1.5, 0.0, -1.5]),
    ([3, 2, 1], {"eps": 0.5}, [1 / 1.5, 0.0, -1 / 1.5]),
    # identical rewards and a group of one: exactly 0, never NaN, whatever the options
    ([0.1, 0.1, 0.1], {}, [0.0, 0.0, 0.0]),
    ([0.7] * 5, {"std": "population", "eps": 0.0}, [0.0] * 5),
    ([1.0, 1.0], {"baseline": "leave_one_out"}, [0.0, 0.0]),
    ([1.0], {}, [0.0]),
    ([1.0], {"std": "population", "eps": 0.0}, [0.0]),
    ([0.3], {"baseline": "leave_one_out", "std": "none"}, [0.0]),
    ([], {}, []),
])
def test_group_advantages_match_hand_computed_values(rewards, options, expected):
    from scaffold_core.trajectory import group_normalized

    got = group_normalized(rewards, **options)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert all(x == x for x in got)  # no NaN


def test_grpo_maker_options_are_explicit_and_validated():
    maker = GRPOTrajectoryMaker()
    assert (maker.std, maker.eps, maker.baseline, maker.missing_reward) == ("unbiased", 1e-5, "mean", "drop")
    made = GRPOTrajectoryMaker(baseline="leave_one_out", std="none").make(_episode([1.0, 0.0, 0.0, 1.0]))
    assert [t.advantage for t in made] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    made = GRPOTrajectoryMaker().make(_episode([1.0, None, 1.0]))  # the dropped sample is not in the group
    assert [t.advantage for t in made] == [0.0, 0.0]
    for bad, match in (({"std": "sample"}, "std must be"), ({"baseline": "median"}, "baseline must be"),
                       ({"eps": -1.0}, "eps must be"), ({"missing_reward": "zero"}, "missing_reward must be")):
        with pytest.raises(ValueError, match=match):
            GRPOTrajectoryMaker(**bad)


@pytest.mark.parametrize("name", ["majority_vote", "best_of_n"])
def test_branches_of_a_multi_sample_generator_get_distinct_sample_numbers_and_seeds(name):
    registry = plugin_set().registry
    controller = registry.create("controller", name, {"samples": 3, "generator": {"name": "native", "samples": 2}})
    engine = ScriptedEngine(lambda prompt, request: f"{request.seed} {request.request_id}")
    task = ListTask([{"question": "q", "answer": "a"}])
    [result] = run_episodes(make_contexts(task, engine.tokenizer), engine=engine, controller=controller,
                            verifier=ExactMatchVerifier())
    assert result.ok, result.error
    assert sorted(s.sample_index for s in result.samples) == list(range(6))
    assert len({s.text for s in result.samples}) == 6, [s.text for s in result.samples]


def test_registry_build_takes_a_name_a_mapping_or_the_component_itself_and_names_the_path_of_anything_else():
    from scaffold_core.errors import ConfigError, UnknownComponentError

    registry = plugin_set().registry
    assert isinstance(registry.build("controller", "native"), NativeController)
    options = {"name": "majority_vote", "samples": 3, "generator": {"name": "native", "samples": 2}}
    built = registry.build("controller", options, path="controller")
    assert built.samples == 3 and built.generator.samples == 2 and options["generator"] == {"name": "native",
                                                                                              "samples": 2}
    mine = NativeController()
    assert registry.build("controller", mine) is mine
    for bad in ({"samples": 3}, 3, None, ["native"]):
        with pytest.raises(ConfigError, match=r"controller\.generator: expected a registered controller name"):
            registry.build("controller", bad, path="controller.generator")
    with pytest.raises(ConfigError, match="expected a registered controller name"):  # narrowed by `accepts`
        registry.build("controller", object(), accepts=lambda obj: isinstance(obj, Controller))
    with pytest.raises(UnknownComponentError, match="Did you mean 'native'"):
        registry.build("controller", "nativ")
    with pytest.raises(ConfigError, match=r"controller\.generator: expected a registered controller name .* got 7"):
        registry.create("controller", "majority_vote", {"generator": 7}, path="controller")


def test_top_logprobs_are_a_request_field_and_a_checked_result_field():
    from scaffold_core.sampling import SamplingParams

    assert SamplingParams(max_tokens=4).top_logprobs == 0
    assert SamplingParams(max_tokens=4, top_logprobs=5).to_dict()["top_logprobs"] == 5
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="top_logprobs"):
            SamplingParams(max_tokens=4, top_logprobs=bad)
    GenerationResult([1, 2], [-0.1, -0.2], "stop", top_logprobs=[{1: -0.1}, {2: -0.2, 3: -1.0}]).check()
    assert GenerationResult([1], [-0.1], "stop").top_logprobs is None
    with pytest.raises(ValueError, match="1 top_logprobs entries"):
        GenerationResult([1, 2], [-0.1, -0.2], "stop", top_logprobs=[{1: -0.1}]).check()
