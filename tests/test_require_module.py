"""require_module: the one way the core and its plugins ask for an optional dependency."""

from __future__ import annotations

import json

import pytest

from scaffold_core.errors import MissingDependencyError, require_module


def test_present_modules_are_imported_one_or_several():
    assert require_module("json", needed_by="a test", install="nothing") is json
    mod_json, mod_os = require_module("json", "os", needed_by="a test", install="nothing")
    assert mod_json is json and mod_os.sep in ("/", "\\")
    assert require_module("json", needed_by="a test", install="nothing", load=False) is None


@pytest.mark.parametrize("load", [True, False])
def test_a_missing_module_says_who_needs_it_and_how_to_install_it(load):
    with pytest.raises(MissingDependencyError) as info:
        require_module("json", "no_such_module_here", needed_by="the frobnicator", what="the frob package",
                       install="pip install frob", load=load)
    message = str(info.value)
    assert message.startswith("the frobnicator needs the frob package (")
    assert "no_such_module_here" in message and message.endswith("install it with: pip install frob")
