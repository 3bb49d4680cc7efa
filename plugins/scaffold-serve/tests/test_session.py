"""Sessions on their own (no HTTP): which conversation a request continues, and what counts as drift."""

from __future__ import annotations

from scaffold_core.generation import GenerationResult
from scaffold_core.tokenizers import ByteTokenizer
from scaffold_multiturn.tool_formats import HermesFormat
from scaffold_serve.session import Session
from scaffold_serve.wire import parse_chat_request

TOKENIZER = ByteTokenizer()


def result(text: str, version: int = 0) -> GenerationResult:
    ids = TOKENIZER.encode(text) + [TOKENIZER.eos_token_id]
    return GenerationResult(ids, [-0.5] * len(ids), "stop", text, version)


def request(*messages, tools=None, n=1):
    body = {"model": "scaffold", "messages": [{"role": r, "content": c} for r, c in messages], "n": n}
    if tools is not None:
        body["tools"] = tools
    return parse_chat_request(body)


def call(session, req, *texts, version=0):
    plan = session.plan(req)
    return plan, session.commit(plan, [result(t, version) for t in texts], req)


def test_each_turn_appends_only_the_new_messages_to_the_ids_it_served():
    session = Session("s", TOKENIZER, HermesFormat())
    call(session, request(("user", "a")), "one")
    before = session.trajectories[0].ids()
    plan, _ = call(session, request(("user", "a"), ("assistant", "one"), ("user", "b")), "two", version=3)
    assert plan.kind == "extend" and plan.prompt_ids[:len(before)] == before
    assert TOKENIZER.decode(plan.prompt_ids[len(before):]) == "\n<|user|>\nb<|end|>\n<|assistant|>\n"
    traj = session.trajectories[0]
    assert traj.conv.output_versions == [0] * 4 + [-1] * len(plan.prompt_ids[len(before):]) + [3] * 4


def test_changing_the_tools_or_a_model_turn_is_drift_and_a_new_trajectory():
    session = Session("s", TOKENIZER, HermesFormat())
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call(session, request(("user", "a"), tools=[tool]), "one")
    plan, _ = call(session, request(("user", "a"), ("assistant", "one"), ("user", "b")), "two")
    assert plan.kind == "edit" and plan.drift["kind"] == "tools" and session.drift_count == 1
    plan, _ = call(session, request(("user", "a"), ("assistant", "ONE"), ("user", "b")), "three")
    assert plan.kind == "edit" and plan.drift["kind"] == "edited" and plan.drift["message"] == 1
    assert session.drift_count == 2 and len(session.trajectories) == 3


def test_a_new_conversation_in_the_same_session_is_not_drift():
    session = Session("s", TOKENIZER, HermesFormat())
    call(session, request(("user", "a")), "one")
    plan, _ = call(session, request(("user", "something else")), "two")
    assert plan.kind == "new" and plan.drift is None and session.drift_count == 0


def test_two_requests_extending_the_same_turn_at_once_do_not_mix():
    session = Session("s", TOKENIZER, HermesFormat())
    call(session, request(("user", "a")), "one")
    first = session.plan(request(("user", "a"), ("assistant", "one"), ("user", "x")))
    second = session.plan(request(("user", "a"), ("assistant", "one"), ("user", "y")))
    session.commit(first, [result("X")], request(("user", "a"), ("assistant", "one"), ("user", "x")))
    session.commit(second, [result("Y")], request(("user", "a"), ("assistant", "one"), ("user", "y")))
    assert [t.origin for t in session.trajectories] == ["new", "fork"]
    x, y = (TOKENIZER.decode(t.ids()) for t in session.trajectories)
    assert "x<|end|>" in x and "X" in x and "y<|end|>" not in x
    assert "y<|end|>" in y and "Y" in y and "x<|end|>" not in y and session.drift_count == 0


def test_n_choices_and_samples():
    session = Session("s", TOKENIZER, HermesFormat())
    _, choices = call(session, request(("user", "a"), n=2), "one", "uno")
    assert [c.trajectory for c in choices] == [0, 1] and session.last_trajectory == 0
    plan, _ = call(session, request(("user", "a"), ("assistant", "uno"), ("user", "b")), "dos")
    assert plan.kind == "extend" and session.last_trajectory == 1
    samples = [t.sample("dos", None, k, {"session": "s"}) for k, t in enumerate(session.trajectories)]
    assert [s.generated_tokens for s in samples] == [4, 8]
    assert samples[1].metadata["template_drift"]["kind"] is None
