"""Options declared once: the factory's signature gives validation, --show-options and scaffold config's defaults."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from annotated_types import Ge, Le

from scaffold_core.cli.main import main
from scaffold_core.errors import ConfigError
from scaffold_core.plugins import Help, option_table
from scaffold_core.plugins.options import validate_options


class Declared:
    def __init__(self, size: Annotated[int, Ge(1), Le(8), Help("how many")] = 2, label: str = "x",
                 needed: Annotated[float, Help("a weight")] = ...):  # type: ignore[assignment]
        self.size = size


def test_one_declaration_gives_type_default_bounds_and_help():
    table = {o.name: o for o in option_table(Declared)}
    assert (table["size"].type, table["size"].default, table["size"].bounds, table["size"].help) == \
        ("int", 2, ">= 1, <= 8", "how many")
    assert table["label"].bounds == "" and table["label"].help == ""


def test_bounds_are_enforced_and_the_error_names_them():
    assert validate_options(Declared, {"size": 8, "needed": 1}, path="task", label="task 'd'") == {"size": 8,
                                                                                                  "needed": 1.0}
    with pytest.raises(ConfigError, match=r"task\.size: Input should be less than or equal to 8; got 9 .*"
                                          r"int \(>= 1, <= 8\) = 2"):
        validate_options(Declared, {"size": 9, "needed": 1}, path="task", label="task 'd'")


def test_show_options_lists_a_builtin_components_declaration(capsys):
    assert main(["list-plugins", "--show-options", "controller:majority_vote"]) == 0
    out = capsys.readouterr().out
    assert "controller:majority_vote" in out and "samples: int (default 4, >= 1)  branches of the generator" in out
    assert main(["list-plugins", "--show-options", "native", "--json"]) == 0
    (native,) = json.loads(capsys.readouterr().out)["controller:native"]
    assert native == {"name": "samples", "type": "int", "default": 1, "required": False, "bounds": ">= 1",
                      "help": "responses per prompt, generated concurrently"}
    assert main(["list-plugins", "--show-options", "no_such_thing"]) == 1
    assert "no installed component is called 'no_such_thing'" in capsys.readouterr().err


def test_config_fills_in_the_selected_components_declared_defaults(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n', encoding="utf-8")
    config = tmp_path / "c.yaml"
    config.write_text(f"task: {{name: dataset, path: {tmp_path / 'rows.jsonl'}}}\ncontroller: {{name: majority_vote}}\n"
                      "engine: {name: benchmark_canned}\n", encoding="utf-8")
    assert main(["config", str(config)]) == 0
    import yaml

    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["controller"] == {"name": "majority_vote", "samples": 4, "generator": None}
    assert printed["task"]["split"] == "test" and printed["task"]["limit"] is None
