"""The agent controller on a scripted engine: tool calls right and wrong, timeouts, parallel calls, budgets,
and trajectories that are exactly the engine's tokens plus the rendered tool results, token by token."""

from __future__ import annotations

import asyncio
import time

import pytest
from agent_helpers import AddTool, RecordingEngine, agent, call, check_token_by_token, last_user, registry, turn_of
from mt_helpers import run
from scaffold_testkit import ListTask

from scaffold_core import hookimpl
from scaffold_core.tool import Tool, ToolResult
from scaffold_gsm8k.verifier import GSM8KVerifier
from scaffold_multiturn.tool_formats import HermesFormat

ROW = {"id": "q", "question": "What is 2 + 3?", "answer": "#### 5"}


def one(respond, ctrl=None, *, engine=None, rows=None, **options):
    """Run one episode (or ``rows``) of the agent on a recording scripted engine; returns (result, engine)."""
    engine = engine or RecordingEngine(respond)
    max_tokens = options.pop("max_tokens", 256)
    results = run(ListTask(rows or [ROW]), engine, ctrl or agent(**options), verifier=GSM8KVerifier(),
                  max_tokens=max_tokens)
    return results[0], engine


# -- the loop ----------------------------------------------------------------------------------


def test_right_call_then_answer():
    def respond(prompt, request):
        if turn_of(prompt) == 0:
            return "I will add.\n" + call("add", a=2, b=3)
        return f"The tool says {last_user(prompt).split()[1]}.\n#### 5"

    result, engine = one(respond)
    assert result.ok, result.error
    sample = result.samples[0]
    assert sample.reward == 1.0 and sample.text == "The tool says 5.\n#### 5"
    assert sample.metadata["end"] == "answer"
    tool_message = sample.metadata["messages"][1]
    assert tool_message == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
    [logged] = sample.metadata["tool_calls"]
    assert (logged["name"], logged["arguments"], logged["ok"], logged["turn"]) == ("add", {"a": 2, "b": 3}, True, 0)
    assert result.metrics["turns"] == 2.0 and result.metrics["tool_calls"] == 1.0
    assert result.metrics["tool_errors"] == 0.0 and result.metrics["answered"] == 1.0
    check_token_by_token(result, engine)
    traj = result.trajectories[0]
    assert traj.turn_rewards == [0.0, 1.0] and traj.reward == 1.0


@pytest.mark.parametrize("written, kind, says", [
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2,}}\n</tool_call>", "parse_error", "not valid JSON"),
    ("<tool_call>[\"add\", 2, 3]</tool_call>", "parse_error", "must be a JSON object"),
    ("<tool_call>{\"arguments\": {\"a\": 2, \"b\": 3}}</tool_call>", "parse_error", "has no \"name\""),
    ("<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}", "parse_error", "not closed"),
    (call("ad", a=2, b=3), "unknown_tool", "Did you mean 'add'?"),
    (call("add", a=2), "bad_arguments", "'b' is a required property"),
    (call("add", a=2, b="three"), "bad_arguments", "is not of type 'number'"),
    (call("add", a=2, b=3, c=4), "bad_arguments", "Additional properties are not allowed"),
])
def test_malformed_calls_become_error_results_the_model_reads(written, kind, says):
    seen = []

    def respond(prompt, request):
        if turn_of(prompt) == 0:
            return written
        seen.append(last_user(prompt))
        return "#### 5"

    result, engine = one(respond)
    assert result.ok, result.error  # never a crash
    assert seen and seen[0].startswith(f"<tool_response>\nError ({kind}): ") and says in seen[0]
    assert result.metrics[f"tool_error_{kind}"] == 1.0 and result.metrics["tool_errors"] == 1.0
    assert result.samples[0].metadata["tool_calls"][0]["error"] == kind
    assert result.samples[0].reward == 1.0
    check_token_by_token(result, engine)


def test_a_slow_tool_times_out_and_the_episode_goes_on():
    reg = registry()

    def respond(prompt, request):
        return call("sleep", seconds=30) if turn_of(prompt) == 0 else f"after: {last_user(prompt)}\n#### 5"

    started = time.perf_counter()
    result, engine = one(respond, agent(reg, tools=[{"name": "sleep", "timeout": 0.2}]))
    assert time.perf_counter() - started < 10
    assert result.ok and result.metrics["tool_error_timeout"] == 1.0
    assert "Error (timeout): tool 'sleep' timed out after 0.2 s" in result.samples[0].text
    # tool_timeout overrides the tool's own
    result, _ = one(respond, agent(reg, tools=[{"name": "sleep", "timeout": 60}], tool_timeout=0.1))
    assert "timed out after 0.1 s" in result.samples[0].text


class MeetTool(Tool):
    """Each call waits until ``of`` calls of its episode have arrived: calls run one after another time out."""

    name = "meet"
    description = "Wait for the others."
    parameters = {"type": "object", "properties": {"who": {"type": "string"}, "of": {"type": "integer"}},
                  "required": ["who", "of"]}

    async def call(self, arguments, context):
        arrived = context.state.setdefault("arrived", [])
        everyone = context.state.setdefault("everyone", asyncio.Event())
        arrived.append(arguments["who"])
        if len(arrived) == arguments["of"]:
            everyone.set()
        await everyone.wait()  # bounded by the tool's timeout
        return ToolResult(f"met {arguments['who']}")


class MeetTools:
    @hookimpl
    def register_tools(self, registry):
        registry.add("meet", MeetTool)


def test_calls_of_one_turn_run_concurrently_and_results_keep_their_order():
    reg = registry(MeetTools())
    calls = "\n".join([call("meet", who="a", of=2), call("add", a=1, b=1), call("meet", who="b", of=2)])

    def respond(prompt, request):
        return calls if turn_of(prompt) == 0 else last_user(prompt)

    # Run one after another, the first `meet` would wait for the second until its timeout.
    result, _ = one(respond, agent(reg, tools=["add", "meet"], tool_timeout=30))
    assert result.ok, result.error
    assert result.samples[0].text == ("<tool_response>\nmet a\n</tool_response>\n<tool_response>\n2\n"
                                      "</tool_response>\n<tool_response>\nmet b\n</tool_response>")
    assert result.metrics["tool_calls"] == 3.0


def test_calls_past_max_calls_per_turn_are_refused_unrun():
    def respond(prompt, request):
        return "".join(call("add", a=i, b=0) for i in range(4)) if turn_of(prompt) == 0 else last_user(prompt)

    result, _ = one(respond, max_calls_per_turn=2)
    text = result.samples[0].text
    assert text.count("Error (limit): not run: at most 2 tool calls") == 2 and "\n0\n" in text and "\n1\n" in text
    assert result.metrics["tool_error_limit"] == 2.0


def test_max_turns_brings_an_answer_now_turn_and_skips_the_last_calls():
    prompts = []

    def respond(prompt, request):
        prompts.append(prompt)
        return call("add", a=1, b=turn_of(prompt))  # never answers

    result, engine = one(respond, max_turns=3)
    assert result.ok and len(prompts) == 3
    assert "give your final answer now" not in prompts[1]
    assert last_user(prompts[2]).startswith("You have used up your budget for tool calls.")
    metadata = result.samples[0].metadata
    assert (metadata["end"], metadata["forced_answer"]) == ("max_turns", "max_turns")
    assert result.metrics["tool_calls"] == 2.0 and result.metrics["tool_calls_skipped"] == 1.0
    assert result.metrics["max_turns_reached"] == 1.0 and result.metrics["forced_answer"] == 1.0
    check_token_by_token(result, engine)


def test_answer_now_null_gives_no_extra_message():
    prompts = []

    def respond(prompt, request):
        prompts.append(prompt)
        return call("add", a=1, b=1)

    one(respond, max_turns=2, answer_now=None)
    assert last_user(prompts[1]).startswith("<tool_response>")


def test_the_token_budget_forces_an_answer_and_is_never_exceeded():
    prompts = []

    def respond(prompt, request):
        prompts.append(prompt)
        return "Thinking it over at some length. " * 3 + call("add", a=2, b=3)

    probe, _ = one(lambda p, r: "#### 5")
    prompt_len = len(probe.samples[0].prompt_ids)
    budget = prompt_len + 900
    result, engine = one(respond, max_turns=20, max_total_tokens=budget, answer_reserve=150, max_tokens=200)
    traj = result.trajectories[0]
    assert result.ok and len(traj.input_ids) <= budget
    assert result.samples[0].metadata["forced_answer"] == "context"
    assert "You have used up your budget" in last_user(prompts[-1])
    assert result.samples[0].metadata["end"] == "context" and result.metrics["context_exhausted"] == 1.0
    for request, _ in engine.results:  # each turn's max_tokens fits in what is left
        assert len(request.prompt_ids) + request.sampling.max_tokens <= budget
    check_token_by_token(result, engine)


def test_answer_tag_ends_the_episode_and_its_content_is_scored():
    ran = []

    def respond(prompt, request):
        ran.append(turn_of(prompt))
        return "Done: <answer>#### 5</answer> " + call("add", a=1, b=1)

    result, _ = one(respond, answer_tag="answer")
    assert ran == [0] and result.samples[0].text == "#### 5" and result.samples[0].reward == 1.0
    assert result.metrics["tool_calls"] == 0.0 and result.samples[0].metadata["end"] == "answer"


def test_stop_on_answer_stops_when_the_verifier_finds_an_answer():
    def respond(prompt, request):
        return "#### 5\n" + call("add", a=2, b=3)

    result, _ = one(respond, stop_on_answer=True)
    assert result.metrics["turns"] == 1.0 and result.metrics["tool_calls"] == 0.0
    assert result.samples[0].reward == 1.0


def test_a_turn_cut_by_max_tokens_is_closed_and_stays_faithful():
    def respond(prompt, request):
        if turn_of(prompt) == 0:
            return call("add", a=2, b=3) + " and then some more text that goes on and on past the limit"
        return "#### 5"

    result, engine = one(respond, max_tokens=80)
    turns = result.samples[0].metadata["turns"]
    assert turns[0]["finish_reason"] == "length" and result.ok
    check_token_by_token(result, engine)


# -- composition ------------------------------------------------------------------------------


@pytest.mark.parametrize("outer", ["majority_vote", "best_of_n"])
def test_agent_as_the_generator_of_vote_and_best_of_n(outer):
    reg = registry()
    ctrl = reg.create("controller", outer, {"samples": 3, "generator": {"name": "agent", "tools": ["add"]}},
                      path="controller")

    def respond(prompt, request):
        if turn_of(prompt) == 0:
            return call("add", a=2, b=3)
        return f"#### {last_user(prompt).split()[1]}"

    engine = RecordingEngine(respond)
    [result] = run(ListTask([ROW]), engine, ctrl, verifier=GSM8KVerifier(), max_tokens=256)
    assert result.ok, result.error
    assert len(result.samples) == 3 and all(s.reward == 1.0 for s in result.samples), [s.text for s in result.samples]
    assert result.answer == "5" and result.answer_reward == 1.0
    assert sorted(s.sample_index for s in result.samples) == [0, 1, 2]
    for sample, traj in zip(result.samples, result.trajectories):
        assert sum(traj.loss_mask) == sum(sample.output_mask) > 0


def test_several_samples_per_prompt_are_separate_conversations():
    def respond(prompt, request):
        return call("add", a=1, b=request.seed % 5) if turn_of(prompt) == 0 else last_user(prompt)

    result, _ = one(respond, samples=3)
    assert len(result.samples) == 3 and len(result.trajectories) == 3
    assert result.metrics["turns"] == 2.0


# -- tools' lifecycle -------------------------------------------------------------------------


class Counted(AddTool):
    def __init__(self):
        self.events: list[str] = []

    async def start(self):
        self.events.append("start")

    async def close(self):
        self.events.append("close")


def test_tools_are_started_and_closed_with_the_run_and_shared_by_clones():
    from scaffold_multiturn.agent import AgentController

    tool = Counted()
    ctrl = AgentController(tools=[tool], format=HermesFormat())
    clone = ctrl.clone()
    assert clone.tools["add"] is tool and clone.tools is not ctrl.tools and clone.format is ctrl.format
    result, _ = one(lambda p, r: call("add", a=1, b=2) if turn_of(p) == 0 else "#### 3", ctrl)
    assert result.ok and tool.events == ["start", "close"]


def test_a_failing_engine_fails_the_episode():
    engine = RecordingEngine(lambda p, r: call("add", a=1, b=2), fail=lambda prompt: "<tool_response>\n3" in prompt)
    result, _ = one(None, engine=engine)
    assert result.status == "failed" and result.error_component == "engine"


# -- formats ----------------------------------------------------------------------------------


def test_hermes_puts_the_tools_in_the_system_prompt():
    fmt = HermesFormat()
    tools = [AddTool()]
    prompt = fmt.prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools, None)
    system = prompt.messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools") and '"name": "add"' in system and prompt.template_kwargs == {}
    alone = fmt.prompt([{"role": "user", "content": "hi"}], tools, None).messages
    assert alone[0]["role"] == "system" and alone[1] == {"role": "user", "content": "hi"}
    custom = HermesFormat(tools_prompt="Use <{call}>: {tools}", call_tag="act", response_tag="obs")
    assert custom.describe(tools).startswith('Use <act>: {"type": "function"')
    assert custom.parse('<act>{"name": "add", "arguments": {"a": 1, "b": 2}}</act>')[0].arguments == {"a": 1, "b": 2}


def test_hermes_parsing():
    fmt = HermesFormat()
    assert fmt.parse("No tools needed. #### 5") == []
    text = ('a <tool_call>```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```</tool_call> b '
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}", "id": "x"}</tool_call>'
            '<tool_call>{"name": "notes", "parameters": {"action": "read"}}</tool_call>')
    calls = fmt.parse(text)
    assert [(c.name, c.arguments, c.id, c.error) for c in calls] == [
        ("add", {"a": 1, "b": 2}, "call_0", None), ("add", '{"a": 3, "b": 4}', "x", None),
        ("notes", {"action": "read"}, "call_2", None)]
    assert calls[1].text.startswith("<tool_call>") and calls[1].text.endswith("</tool_call>")


def test_the_format_is_selected_by_name_with_its_options():
    reg = registry()
    ctrl = agent(reg, format={"name": "hermes", "call_tag": "act", "response_tag": "obs"})

    def respond(prompt, request):
        return '<act>{"name": "add", "arguments": {"a": 2, "b": 3}}</act>' if turn_of(prompt) == 0 else "#### 5"

    result, engine = one(respond, ctrl)
    assert result.samples[0].metadata["messages"][1]["content"] == "<obs>\n5\n</obs>"
    check_token_by_token(result, engine, fmt=HermesFormat(call_tag="act", response_tag="obs"))


def test_native_refuses_a_template_without_tools_support():
    result, _ = one(lambda p, r: "#### 5", format="native")
    assert result.status == "failed" and result.error_component == "tool_format"
    assert "ignores tools=" in result.error and "use format: hermes" in result.error


TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|user|>\n[{{ m.name }}] {{ m.content }}<|end|>\n"
    "{% else %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ToolsTemplateTokenizer:
    """The ByteTokenizer with a Jinja template that renders ``tools=`` and ``tool`` messages (no model needed)."""

    def __new__(cls):
        from mt_helpers import JinjaByteTokenizer

        class WithTools(JinjaByteTokenizer):
            def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False, tools=None, **_):
                text = self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                             tools=tools)
                return self.encode(text) if tokenize else text

        return WithTools(TOOLS_TEMPLATE)


def test_native_renders_tools_and_tool_messages_through_the_template():
    from scaffold_multiturn.tool_formats import NativeFormat

    def respond(prompt, request):
        if turn_of(prompt) == 0:
            assert prompt.startswith("<|system|>\nTools: add<|end|>\n")
            return call("add", a=2, b=3) + call("add", a=1)
        return "#### 5"

    engine = RecordingEngine(respond)
    engine.tokenizer = ToolsTemplateTokenizer()
    result, _ = one(None, engine=engine, format="native")
    assert result.ok, result.error
    messages = result.samples[0].metadata["messages"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "tool", "assistant"]
    assert messages[1] == {"role": "tool", "name": "add", "tool_call_id": "call_0", "content": "5"}
    assert messages[2]["content"].startswith("Error (bad_arguments)")
    check_token_by_token(result, engine, fmt=NativeFormat())


def test_a_third_party_format_is_selected_by_name():
    from scaffold_core import hookimpl
    from scaffold_core.tool_format import ToolCall, ToolFormat, ToolPrompt, result_text

    class Slash(ToolFormat):
        name = "slash"

        def prompt(self, messages, tools, tokenizer):
            return ToolPrompt([{"role": "system", "content": "Call tools as /name a b"}, *messages])

        def parse(self, text):
            out = []
            for i, line in enumerate(text.splitlines()):
                if line.startswith("/"):
                    name, *args = line[1:].split()
                    out.append(ToolCall(name, dict(zip("ab", map(float, args))), id=str(i), text=line))
            return out

        def result_messages(self, calls, results):
            return [{"role": "user", "content": "; ".join(result_text(r) for r in results)}]

    class Plugin:
        @hookimpl
        def register_tool_formats(self, registry):
            registry.add("slash", Slash)

    reg = registry(Plugin())
    assert "slash" in reg.names("tool_format") and {"hermes", "native"} <= set(reg.names("tool_format"))

    def respond(prompt, request):
        return "/add 2 3" if turn_of(prompt) == 0 else f"#### {float(last_user(prompt)):g}"

    result, _ = one(respond, agent(reg, format="slash"))
    assert result.ok and result.samples[0].reward == 1.0


# -- configuration -----------------------------------------------------------------------------


def config_error(data):
    from scaffold_core.config import load_config
    from scaffold_core.errors import ConfigError

    base = {"task": {"name": "list", "rows": [ROW]}, "engine": {"name": "benchmark_canned"}}
    with pytest.raises(ConfigError) as caught:
        load_config(data={**base, **data}, registry=registry(_list_task_plugin()))
    return str(caught.value)


def _list_task_plugin():
    import scaffold_testkit.plugin as test_tasks

    return test_tasks


def test_config_selects_tools_by_name_with_validated_options():
    from scaffold_core.config import load_config

    reg = registry(_list_task_plugin())
    data = {"task": {"name": "list", "rows": [ROW]}, "engine": {"name": "benchmark_canned"},
            "controller": {"name": "agent", "tools": ["add", {"name": "sleep", "timeout": 2}]}}
    config = load_config(data=data, registry=reg)
    built = reg.create("controller", config.controller.name, config.controller.options, path="controller")
    assert list(built.tools) == ["add", "sleep"] and built.tools["sleep"].timeout == 2


@pytest.mark.parametrize("controller, says", [
    ({"name": "agent", "tools": ["add", {"name": "sleep", "timeout": "soon"}]}, "controller.tools[1].timeout"),
    ({"name": "agent", "tools": ["add", {"name": "sleep", "timout": 1}]}, "controller.tools[1].timout: unknown option"),
    ({"name": "agent", "tools": ["ad"]}, "controller.tools[0]: unknown tool 'ad'"),
    ({"name": "agent", "tools": [{"timeout": 1}]}, "controller.tools[0]: expected a registered tool name"),
    ({"name": "agent"}, "controller.tools: the agent needs at least one tool; choose from: add"),
    ({"name": "agent", "tools": ["add", "add"]}, "controller.tools[1]: two tools are both called 'add'"),
    ({"name": "agent", "tools": ["add"], "format": "hermez"}, "controller.format: unknown tool_format 'hermez'"),
    ({"name": "agent", "tools": ["add"], "format": {"name": "hermes", "call_tag": "a b"}}, "controller.format: "),
    ({"name": "agent", "tools": ["add"], "max_turns": 0},
     "controller.max_turns: Input should be greater than or equal to 1; got 0"),
    ({"name": "majority_vote", "generator": {"name": "agent", "tools": ["add", {"name": "sleep", "x": 1}]}},
     "controller.generator.tools[1].x: unknown option"),
])
def test_config_errors_name_the_key_path(controller, says):
    message = config_error({"controller": controller})
    assert says in message, message


def test_unknown_tool_names_suggest_the_package():
    message = config_error({"controller": {"name": "agent", "tools": ["calculater"]}})
    assert "pip install" in message

