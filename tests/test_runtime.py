"""The runtime: episode isolation, failures that never hang or hide, controllers, hooks."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from scaffold_core import hookimpl
from scaffold_core.builtins.controllers import BestOfNController, MajorityVoteController, NativeController
from scaffold_core.builtins.trajectories import GRPOTrajectoryMaker, SingleTurnTrajectoryMaker
from scaffold_core.builtins.verifiers import ExactMatchVerifier
from scaffold_core.controller import Controller
from scaffold_core.episode import Outcome
from scaffold_core.errors import EngineError
from scaffold_core.generation import GenerationResult, VerificationTask
from scaffold_core.plugins.lifecycle import Hooks
from scaffold_core.testing import ListTask, ScriptedEngine, make_contexts, plugin_set, run_episodes
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


class AbortingEngine(ScriptedEngine):
    async def generate(self, request):
        return GenerationResult([], [], "abort", "", meta={"message": "paused for a weight update"})


def test_malformed_and_aborted_engine_results_fail_the_episode():
    ctxs = make_contexts(ListTask(rows(1)), MalformedEngine().tokenizer)
    r = run_episodes(ctxs, engine=MalformedEngine(), controller=NativeController(), verifier=ExactMatchVerifier())[0]
    assert r.error_component == "engine" and "3 output ids but 1 logprobs" in r.error
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
    assert adv[-1] == pytest.approx(3 ** 0.5, rel=1e-4) and adv[0] == pytest.approx(-(3 ** -0.5), rel=1e-4)
    assert sum(adv) == pytest.approx(0.0, abs=1e-6)
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


def test_padded_tensor_dict_matches_areal_keys():
    torch = pytest.importorskip("torch")
    from scaffold_core.train.padding import to_padded_tensor_dict
    from scaffold_core.trajectory import TrainingSample

    a = TrainingSample([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25], [-1, 3, 3], 1.0, 0.5, "e", 0, "e", 1, "stop")
    b = TrainingSample([5, 8], [0, 1], [0.0, -1.0], [-1, 3], 0.0, -0.5, "e", 1, "e", 1, "length")
    batch = to_padded_tensor_dict([a, b.to_dict()], pad_token_id=2)
    assert set(batch) >= {"input_ids", "attention_mask", "loss_mask", "logprobs", "versions", "rewards"}
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 8, 2]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    assert batch["versions"].tolist() == [[-1, 3, 3], [-1, 3, 0]]  # padding is 0, as AReaL pads
    assert batch["rewards"].tolist() == [1.0, 0.0] and batch["rewards"].dtype == torch.float32
    assert batch["logprobs"][0].tolist() == [0.0, -0.5, -0.25]


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
        for i in range(20):
            task = ctx.generation_task(i)
            yield [task]
            tasks.append(task)
        return Outcome(samples=tasks)


def test_an_episode_past_episode_timeout_fails_as_timeout():
    engine = ScriptedEngine(echo_answer, delay=0.1)
    start = time.perf_counter()
    result = run_episodes(make_contexts(ListTask(rows(1)), engine.tokenizer), engine=engine, controller=ManySteps(),
                          verifier=ExactMatchVerifier(), episode_timeout=0.5, request_timeout=5.0)[0]
    assert time.perf_counter() - start < 1.8
    assert result.status == "failed" and result.error_component == "timeout"
    assert "0.5 s (rollout.episode_timeout)" in result.error and not result.samples
