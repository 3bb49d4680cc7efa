"""The judge: on the policy engine, at an OpenAI-compatible URL, on another engine; malformed means unscored."""

from __future__ import annotations

import json
import math

import httpx
import pytest
from methods_testkit import ScriptEngine, run
from scaffold_testkit import ListTask, ScriptedEngine, build, make_contexts, run_episodes

from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker
from scaffold_core.errors import ConfigError, VerifierError
from scaffold_core.sampling import SamplingParams
from scaffold_methods.backends import JudgeError
from scaffold_methods.judge import JudgeVerifier
from scaffold_methods.rerank import RerankController

ROWS = [{"id": "q", "question": "What is 7 + 5?", "answer": "12"}]
SAMPLING = SamplingParams(max_tokens=64, temperature=1.0, seed=3)
ANSWERS = ["I say 11. #### 11", "It is 12. #### 12", "Maybe 13. #### 13"]


def grade(prompt: str, request=None) -> str:
    """A scripted judge: likes 12, dislikes 11, cannot make up its mind about anything else."""
    response = prompt.rsplit("Response:\n", 1)[-1]
    if "#### 12" in response:
        return "The steps are right.\nScore: 9"
    if "#### 11" in response:
        return "Score: 2"
    return "Score: 3 ... no, Score: 8"  # conflicting: malformed


def test_rerank_on_the_policy_engine_chooses_by_the_judge_and_keeps_rewards_from_the_verifier():
    engine = ScriptEngine(lambda q, i: ANSWERS[i], probe=grade, markers=["Response:\n"])
    controller = RerankController(samples=3, scorer={"name": "judge", "max_tokens": 32})
    [result] = run(controller, engine, ROWS, SAMPLING)
    assert result.ok, result.error
    assert [s.metadata["score"] for s in result.samples] == [pytest.approx(0.2), pytest.approx(0.9), None]
    assert "conflicting" in result.samples[2].metadata["score_reason"]
    assert result.chosen == 1 and result.answer == "12" and result.metrics["best@3"] == 1.0
    assert result.metrics["unscored"] == 1.0
    assert [s.reward for s in result.samples] == [0.0, 1.0, 0.0]  # rewards: the run's verifier, not the judge
    judged = [r for r in engine.requests if r.sampling.max_tokens == 32]
    assert len(judged) == 3 and all(r.sampling.temperature == 0.0 for r in judged)
    assert result.metrics["verifier_tokens"] == sum(len(grade(t)) + 1 for t in ("#### 11", "#### 12", "?"))
    assert result.metrics["policy_tokens"] == sum(len(a) + 1 for a in ANSWERS)
    # the judge's requests use their own sample numbers (seeds and request ids apart from the responses')
    assert all(int(r.request_id.split("/")[2]) >= 1_000_000 for r in judged)


def test_an_all_unscored_judgement_still_answers_with_the_first_response():
    engine = ScriptEngine(lambda q, i: ANSWERS[2], probe=lambda p, r: "no idea", markers=["Response:\n"])
    [result] = run(RerankController(samples=2, scorer="judge"), engine, ROWS, SAMPLING)
    assert result.ok and result.chosen == 0 and result.metrics["unscored"] == 2.0


def test_as_the_run_verifier_a_policy_judge_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="url:"):
        JudgeVerifier().verify("12", "12")


# -- an OpenAI-compatible URL -------------------------------------------------------------------------


def completion(content, tokens=7, logprobs=None):
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if logprobs is not None:
        choice["logprobs"] = {"content": [logprobs]}
    return {"id": "c", "object": "chat.completion", "choices": [choice], "usage": {"completion_tokens": tokens}}


def url_judge(handler, **options):
    judge = JudgeVerifier(url="http://judge.test/v1", model="grader", **options)
    judge.backend.transport = httpx.MockTransport(handler)
    return judge


def test_a_url_judge_posts_chat_completions_and_reads_the_score(monkeypatch):
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json=completion("Score: 7"))

    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    judge = url_judge(handler, api_key_env="JUDGE_KEY", use_reference=True)
    verdict = judge.verify("It is 12.", "12")
    assert verdict.reward == pytest.approx(0.7) and verdict.scored
    body = json.loads(seen[0].content)
    assert str(seen[0].url) == "http://judge.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-test"
    assert body["model"] == "grader" and body["max_tokens"] == 64 and body["temperature"] == 0.0
    asked = body["messages"][-1]["content"]
    assert "It is 12." in asked and "The correct answer is: 12" in asked


def test_a_malformed_judgement_is_an_unscored_sample_never_zero():
    judge = url_judge(lambda request: httpx.Response(200, json=completion("I would rather not say.")))
    verdict = judge.verify("It is 12.", "12")
    assert not verdict.scored and math.isnan(verdict.reward) and "malformed" in verdict.reason
    task = ListTask(ROWS)
    engine = ScriptedEngine("It is 12. #### 12")
    [result] = run_episodes(make_contexts(task, engine.tokenizer, SAMPLING), engine=engine,
                            controller=RerankController(samples=2, scorer=judge),
                            verifier=judge, trajectory_maker=SingleTurnTrajectoryMaker())
    assert result.ok, result.error
    assert all(s.reward is not None and math.isnan(s.reward) for s in result.samples)
    assert result.trajectories == []  # no reward, no training sequence: never a 0.0


@pytest.mark.parametrize("reply, match, retryable", [
    (httpx.Response(500, text="overloaded"), "HTTP 500", True),
    (httpx.Response(429, text="slow down"), "HTTP 429", True),
    (httpx.Response(401, text="bad key"), "HTTP 401", False),
    (httpx.Response(200, text="<html>not json</html>"), "no chat completion", False),
    (httpx.Response(200, json={"choices": []}), "no chat completion", False),
    (httpx.Response(200, content=b"x" * (5 << 20)), "over 4 MiB", True),
])
def test_a_judge_that_cannot_be_asked_fails_the_episode(reply, match, retryable):
    judge = url_judge(lambda request: reply)
    with pytest.raises(JudgeError, match=match) as caught:
        judge.verify("12", "12")
    assert isinstance(caught.value, VerifierError) and caught.value.retryable is retryable


def test_transport_failures_and_missing_keys_are_named(monkeypatch):
    def refuse(request):
        raise httpx.ConnectError("connection refused")

    with pytest.raises(JudgeError, match="ConnectError"):
        url_judge(refuse).verify("12", "12")
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(JudgeError, match="NO_SUCH_KEY_VAR is not set"):
        url_judge(lambda r: httpx.Response(200, json=completion("Score: 1")), api_key_env="NO_SUCH_KEY_VAR").verify(
            "12", "12")
    for bad in ({"url": "ftp://x"}, {"url": "http://x"}, {"url": "http://x", "model": "m", "engine": {"name": "x"}},
                {"mode": "vote"}, {"low": 5, "high": 5}, {"template": "no placeholder"}):
        with pytest.raises((ConfigError, ValueError)):
            build(JudgeVerifier, **bad)


def test_yes_no_at_a_url_reads_the_first_tokens_logprobs():
    first = {"token": "Yes", "logprob": math.log(0.6),
             "top_logprobs": [{"token": "Yes", "logprob": math.log(0.6)}, {"token": "No", "logprob": math.log(0.2)}]}
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion("Yes", tokens=1, logprobs=first))

    verdict = url_judge(handler, mode="yes_no").verify("12", "12")
    assert verdict.reward == pytest.approx(0.75)
    assert seen[0]["max_tokens"] == 1 and seen[0]["logprobs"] is True and seen[0]["top_logprobs"] == 20


def test_a_url_judge_scores_inside_an_episode_on_the_runs_loop():
    calls = []

    def handler(request):
        content = json.loads(request.content)["messages"][-1]["content"]
        calls.append(content)
        return httpx.Response(200, json=completion(grade(content), tokens=5))

    judge = url_judge(handler)
    engine = ScriptEngine(lambda q, i: ANSWERS[i])
    [result] = run(RerankController(samples=3, scorer=judge), engine, ROWS, SAMPLING)
    assert result.ok, result.error
    assert result.chosen == 1 and len(calls) == 3 and result.metrics["verifier_tokens"] == 15
    assert len(engine.requests) == 3  # the policy engine generated only the responses


# -- another engine -------------------------------------------------------------------------------------


def test_a_judge_on_another_engine_as_verifier_and_as_scorer():
    judge = JudgeVerifier(engine={"name": "benchmark_canned", "response": "Score: 7"})
    try:
        assert judge.verify("12", "12").reward == pytest.approx(0.7)  # from a verifier thread: a private loop
    finally:
        judge.close_private()
    judge = JudgeVerifier(engine={"name": "benchmark_canned", "response": "Score: 6"})
    engine = ScriptEngine(lambda q, i: ANSWERS[i])
    [result] = run(RerankController(samples=2, scorer=judge), engine, ROWS, SAMPLING)
    assert result.ok, result.error
    assert [s.metadata["score"] for s in result.samples] == [pytest.approx(0.6)] * 2
    assert judge.backend.engine.requests == 2 and result.metrics["verifier_tokens"] == 2 * (len("Score: 6") + 1)


def test_placeholders_are_filled_in_one_pass_so_texts_are_never_reinterpreted():
    judge = JudgeVerifier(use_reference=True)
    [system, user] = judge.messages("Q {response} {high}", "R {question} {reference}", "12")
    assert system["role"] == "system" and "Q {response} {high}" in user["content"]
    assert "R {question} {reference}" in user["content"] and "The correct answer is: 12" in user["content"]
    assert "from 0 (certainly wrong) to 10" in user["content"]
