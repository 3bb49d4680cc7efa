"""Token-in, token-out: the conversation's ids are the prompt, the sampled ids and rendered environment turns;
the drift check tells template drift, boundary drift and the model's non-canonical tokens apart."""

from __future__ import annotations

import pytest
from mt_helpers import JinjaByteTokenizer

from scaffold_core.chat_template import TemplateError
from scaffold_core.conversation import Conversation
from scaffold_core.generation import GenerationResult
from scaffold_core.tokenizers import ByteTokenizer, render_chat

pytest.importorskip("jinja2")

#: ChatML with a default system prompt added only when none is given (the shape of SmolLM2's template).
CHATML_DEFAULT_SYSTEM = (
    "{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|system|>\nYou are helpful.<|end|>\n{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
#: Drops the reasoning (<think>...</think>) of every assistant turn but the last (the shape of Qwen3's).
STRIPS_REASONING = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
#: Trims every message's content (the shape of Llama 3's).
TRIMS = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] | trim }}<|end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
#: No end-of-turn token: turns end with a blank line, which a merging tokenizer joins with the next newline.
BLANK_LINE_TURNS = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n\n{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}")

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def ids(tok, text: str, eos: bool = True) -> list[int]:
    return tok.encode(text) + ([tok.eos_token_id] if eos else [])


def converse(tok, turns, replies, messages=QUESTION):
    """A conversation built turn by turn: model ``turns`` ((ids, finish_reason)), environment ``replies``."""
    text, prompt_ids = render_chat(tok, messages)
    conv = Conversation(tok, messages, prompt_ids, text)
    for i, (out, finish) in enumerate(turns):
        conv.add_model_turn(GenerationResult(out, [-0.25 - 0.01 * k for k in range(len(out))], finish, ""))
        if i < len(replies):
            reply = [{"role": "user", "content": replies[i]}]
            env_ids, env_text = conv.environment_tokens(reply)
            conv.add_environment(reply, env_ids, env_text)
    return conv


def test_sequence_is_prompt_then_sampled_ids_then_rendered_environment_turns():
    tok = ByteTokenizer()
    first, second = ids(tok, "It is 6."), ids(tok, "It is 5.")
    conv = converse(tok, [(first, "stop"), (second, "stop")], ["Wrong, try again."])
    _, prompt = render_chat(tok, QUESTION)
    # the environment turn: the rest of the first turn's end ("\n"; "<|end|>" was sampled), the reply, the header
    between = tok.encode("\n<|user|>\nWrong, try again.<|end|>\n<|assistant|>\n")
    assert conv.ids == prompt + first + between + second
    assert conv.output_mask == [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert conv.output_logprobs[len(first):len(first) + len(between)] == [0.0] * len(between)
    assert conv.output_logprobs[:len(first)] == [-0.25 - 0.01 * k for k in range(len(first))]
    assert [m["content"] for m in conv.messages] == ["What is 2 + 3?", "It is 6.", "Wrong, try again.", "It is 5."]
    full = tok.apply_chat_template(conv.messages, tokenize=True)
    assert conv.ids + tok.encode("\n") == full  # the fresh render, less the last turn's trailing newline
    report = conv.drift()
    assert report.kind is None and not report.noncanonical_turns


def test_a_turn_cut_by_max_tokens_is_closed_explicitly():
    tok = ByteTokenizer()
    cut = tok.encode("It is 6 becau")  # finish 'length': no end-of-turn token sampled
    conv = converse(tok, [(cut, "length"), (ids(tok, "5"), "stop")], ["Go on."])
    env = conv.output_ids[len(cut):len(cut) + 3]
    assert env == [tok.eos_token_id, *tok.encode("\n<|user|>")[:2]]  # <|end|> closes the cut turn, masked out
    assert conv.output_mask[len(cut)] == 0
    assert conv.messages[1]["content"] == "It is 6 becau"
    assert conv.turns[0].closed_by_model is False and conv.turns[1].closed_by_model is True
    assert conv.drift().kind is None


def test_a_stop_token_other_than_the_templates_end_stays_in_the_content():
    tok = ByteTokenizer()
    other_stop = tok.encode("6") + [0]  # the model stopped on <|pad|>, which the template never writes
    conv = converse(tok, [(other_stop, "stop"), (ids(tok, "5"), "stop")], ["No."])
    assert conv.turns[0].text == "6"
    assert conv.messages[1]["content"] == "6<|pad|>"  # so a fresh render gives the sampled id back
    assert conv.drift().kind is None


def test_smollm2_shaped_template_with_a_default_system_prompt_is_append_only():
    tok = JinjaByteTokenizer(CHATML_DEFAULT_SYSTEM)
    conv = converse(tok, [(ids(tok, "6"), "stop"), (ids(tok, "still 6"), "stop"), (ids(tok, "5"), "stop")],
                    ["No.", "Still no."])
    report = conv.drift()
    assert report.kind is None and report.prefix_changed_turns == []
    assert tok.decode(conv.ids).startswith("<|system|>\nYou are helpful.<|end|>")


def test_a_template_that_strips_earlier_reasoning_is_reported_as_template_drift():
    tok = JinjaByteTokenizer(STRIPS_REASONING)
    conv = converse(tok, [(ids(tok, "<think>hmm</think>6"), "stop"), (ids(tok, "5"), "stop")], ["No."])
    report = conv.drift()
    assert report.kind == "template"
    assert report.turn == 0  # the first turn is where a fresh render departs from what the model saw
    assert report.prefix_changed_turns == [1]  # the second turn's prompt was not what a fresh render gives
    # the ids stay what the model saw and sampled: the reasoning is still in the sequence
    assert "<think>hmm</think>6" in tok.decode(conv.ids)


def test_a_template_that_trims_content_is_reported_as_template_drift():
    tok = JinjaByteTokenizer(TRIMS)
    conv = converse(tok, [(ids(tok, " 6 "), "stop"), (ids(tok, "5"), "stop")], ["No."])
    assert conv.drift().kind == "template"


def test_text_merging_across_a_turn_boundary_is_reported_as_boundary_drift():
    tok = JinjaByteTokenizer(BLANK_LINE_TURNS, merges=["\n\n"])
    cut = tok.encode("6") + [tok.encode("\n")[0]]  # "6\n", cut by max_tokens before the blank line
    conv = converse(tok, [(cut, "length"), (ids(tok, "5", eos=False), "length")], ["No."])
    report = conv.drift()
    assert report.kind == "boundary"  # same text; "\n" + "\n\n" tokenizes as "\n\n" + "\n" when rendered whole
    assert report.turn == 0


def test_non_canonical_sampled_ids_are_not_drift_but_are_reported():
    tok = JinjaByteTokenizer(CHATML_DEFAULT_SYSTEM, merges=["\n\n"])
    newline = tok.encode("\n")[0]
    sampled = tok.encode("a") + [newline, newline] + tok.encode("b") + [tok.eos_token_id]  # canonical: "\n\n" is one id
    conv = converse(tok, [(sampled, "stop"), (ids(tok, "5"), "stop")], ["No."])
    report = conv.drift()
    assert report.kind is None
    assert report.noncanonical_turns == [0]
    assert conv.output_ids[:len(sampled)] == sampled  # kept exactly as sampled


def test_invalid_utf8_sampled_bytes_are_kept_and_flagged_non_canonical():
    tok = ByteTokenizer()
    lone_byte = [0xC3 + tok.OFFSET, tok.eos_token_id]  # half a UTF-8 character
    conv = converse(tok, [(lone_byte, "stop"), (ids(tok, "5"), "stop")], ["No."])
    report = conv.drift()
    assert conv.output_ids[:2] == lone_byte
    assert report.kind is None and report.noncanonical_turns == [0]


def test_a_template_that_drops_the_last_assistant_turn_is_a_clear_error():
    tok = JinjaByteTokenizer("{% for m in messages if m['role'] != 'assistant' %}<|{{ m['role'] }}|>\n"
                             "{{ m['content'] }}<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n"
                             "{% endif %}")
    with pytest.raises(TemplateError, match="dropped the content of the last assistant turn"):
        converse(tok, [(ids(tok, "6"), "stop")], [])
