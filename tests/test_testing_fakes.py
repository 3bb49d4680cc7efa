"""The test kit's pieces for plugins that adapt a trainer's servers: scripted replies and installation checks."""

from __future__ import annotations

import sys

import pytest
from scaffold_testkit.installed import fake_modules, listed_plugin, modules_loaded
from scaffold_testkit.replies import EOS, TOKENIZER, answers, by_turn


def chat(*turns: str) -> list[int]:
    """A conversation's prompt ids: user turns, each answered but the last, ending on the assistant header."""
    messages = []
    for i, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": "..."})
    return TOKENIZER.encode(TOKENIZER.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_answers_reply_in_order_and_repeat_the_last():
    respond = answers("#### 41", "#### 42")
    got = [respond(chat("q")) for _ in range(3)]
    assert got == [TOKENIZER.encode("#### 41") + [EOS]] + [TOKENIZER.encode("#### 42") + [EOS]] * 2
    with pytest.raises(ValueError, match="at least one text"):
        answers()


def test_by_turn_replies_by_the_conversation_turn():
    respond = by_turn("first", "second")
    assert respond(chat("q")) == TOKENIZER.encode("first") + [EOS]
    assert respond(chat("q", "again")) == TOKENIZER.encode("second") + [EOS]
    assert respond(chat("q", "again", "more")) == TOKENIZER.encode("second") + [EOS]


def test_modules_loaded_sees_what_an_import_pulls_in():
    assert modules_loaded(["json"], ["json", "xml.dom.minidom"]) == ["json"]
    assert modules_loaded(["scaffold_core"], ["torch", "transformers"]) == []


def test_listed_plugin_finds_a_loaded_plugin_and_names_the_listed_when_missing(monkeypatch):
    monkeypatch.setenv("SCAFFOLD_EXTRA_PLUGINS", "scaffold_testkit.plugin")
    assert listed_plugin("scaffold_testkit.plugin")["status"] == "ok"
    with pytest.raises(KeyError, match="'no-such-plugin' is not listed; listed: .*scaffold_testkit.plugin"):
        listed_plugin("no-such-plugin")


def test_fake_modules_creates_parents_and_is_undone_after_the_test(monkeypatch):
    with monkeypatch.context() as m:
        fake_modules(m, {"fakepkg.sub.mod": {"Thing": int}})
        from fakepkg.sub.mod import Thing  # type: ignore[import-not-found]

        assert Thing is int and "fakepkg" in sys.modules and "fakepkg.sub" in sys.modules
    assert not any(name.startswith("fakepkg") for name in sys.modules)
