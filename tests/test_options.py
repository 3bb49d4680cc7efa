"""Options declared once: the factory's signature gives validation, --show-options and scaffold config's defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

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


# -- every installed component declares its options; none checks a range by hand --------------------------------
CONVERTED = [  # (kind, name, option, a value out of bounds, the bound the error and the listing name)
    ("engine", "llamacpp", "n_ctx", 8, ">= 16"),
    ("engine", "vllm", "request_timeout", 0, "> 0"),
    ("engine", "sglang", "max_retries", -1, ">= 0"),
    ("tool", "mcp", "max_output_chars", 5, ">= 100"),
    ("tool", "mcp", "prefix", "a b", "matches ^[A-Za-z0-9_-]{0,32}$"),
    ("tool", "search", "max_chars", 10, ">= 20"),
    ("tool", "calculator", "max_digits", 10**6, "<= 4000"),
    ("tool", "python", "memory_mb", 8, ">= 32"),
    ("controller", "openenv", "step_timeout", 0, "> 0"),
    ("controller", "openai_agent", "context_length", 1, ">= 2"),
    ("controller", "verifiers_rollout", "max_calls", 0, ">= 1"),
    ("controller", "gym_env", "env_threads", 0, ">= 1"),
    ("controller", "multiturn_chat", "turn_discount", 1.5, "<= 1"),
    ("controller", "agent", "answer_reserve", -1, ">= 0"),
    ("controller", "deepconf", "keep", 0, "> 0"),
    ("controller", "dynasor", "min_tokens", -1, ">= 0"),
    ("controller", "tree_search", "budget", 0, ">= 1"),
    ("controller", "rerank", "samples", 0, ">= 1"),
    ("environment", "simulated_user", "request_timeout", 0, "> 0"),
    ("verifier", "math_verify", "timeout_s", 0, ">= 1"),
    ("verifier", "judge", "top_logprobs", -1, ">= 0"),
    ("verifier", "reward_model", "max_length", 4, ">= 8"),
    ("task", "small_arithmetic", "operands", 7, "<= 6"),
    ("task", "reasoning_gym", "size", 0, ">= 1"),
    ("task", "verifiers", "limit", 0, ">= 1"),
    ("trainer", "trl", "num_generations", 1, ">= 2"),
]


@pytest.mark.parametrize("kind, name, option, bad, bound", CONVERTED, ids=[f"{c[1]}.{c[2]}" for c in CONVERTED])
def test_converted_components_are_validated_and_listed_from_their_declaration(kind, name, option, bad, bound):
    from scaffold_core.plugins import get_registry

    registry = get_registry()
    if name not in registry.names(kind):
        pytest.skip(f"the plugin providing {kind} {name!r} is not installed")
    factory = registry.get(kind, name).factory
    listed = {o.name: o for o in option_table(factory)}[option]
    assert bound in listed.bounds.split(", ")
    with pytest.raises(ConfigError) as caught:
        validate_options(factory, {option: bad}, path=kind, label=f"{kind} {name!r}")
    first = str(caught.value).splitlines()[0] if option in str(caught.value).splitlines()[0] else str(caught.value)
    assert f"{kind}.{option}: " in first and f"got {bad!r}" in first and f"({listed.bounds})" in first


#: Components whose factories still check ranges by hand, to convert (none left).
BY_HAND: set[tuple[str, str]] = set()


def _hand_written_range_checks(factory) -> list[str]:
    """``if <option> < 1: raise ...`` and the like in a factory: comparisons of an option with a number."""
    import ast
    import inspect
    import textwrap

    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError):
        return []
    params = set(inspect.signature(factory).parameters)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body)):
            continue
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test  # `if not x > 0`
        named = {n.id for n in ast.walk(test) if isinstance(n, ast.Name) and n.id in params}
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and len(named) > 1:
            continue  # a check across options (`if measure != "sampled" and top_logprobs < 2`)
        for cmp in (n for n in ast.walk(test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            named = any(isinstance(s, ast.Name) and s.id in params for s in sides)
            numeric = any(isinstance(s, ast.Constant) and isinstance(s.value, (int, float)) for s in sides)
            ordered = all(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops)
            if named and numeric and ordered:
                found.append(ast.unparse(cmp))
    return found


def test_no_installed_component_checks_an_option_range_by_hand():
    from scaffold_core.plugins import KINDS, get_registry

    registry = get_registry()
    offenders = {f"{kind} {name}": checks for kind in KINDS for name in registry.names(kind)
                 if (kind, name) not in BY_HAND
                 and (checks := _hand_written_range_checks(registry.get(kind, name).factory))}
    assert offenders == {}, "declare these bounds with Annotated[..., Ge(...)] instead"


class ByHand:
    def __init__(self, limit: int | None = None, size: int = 1, timeout: float = 1.0, kind: str = "a", floor: int = 0):
        if limit is not None and limit < 1:
            raise ValueError("limit")
        if size < 1 or not timeout > 0:
            raise ValueError("size, timeout")
        if kind != "a" and floor < 2:  # across options: allowed
            raise ValueError("floor")


def test_the_range_check_finder_finds_range_checks():
    assert _hand_written_range_checks(ByHand) == ["limit < 1", "size < 1", "timeout > 0"]


# -- the option tables of the docs agree with the declarations --------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- options: (\w+):([\w-]+) ")


def _option_tables() -> list[tuple[str, str, str, list[tuple[list[str], str]]]]:
    """(file, kind, name, rows of (option names, default cell)) for each table marked ``<!-- options: kind:name``."""
    tables = []
    for path in sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("plugins/*/README.md")]):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not (mark := MARK.match(line)):
                continue
            header = [c.strip() for c in lines[i + 1].strip("|").split("|")]
            rows = []
            for row in lines[i + 3:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                rows.append((re.findall(r"`(\w+)`", cells[0]), cells[header.index("default")]))
            tables.append((str(path.relative_to(ROOT)), mark[1], mark[2], rows))
    return tables


def _literal(cell: str) -> tuple[bool, Any]:
    """The default a cell states, when it states a plain value (``4``, ``1e-05``, ``null``, ``"dapo"``, ``run``)."""
    text = cell.strip("`").strip('"')
    if text in ("null", "none", "None", "–", "-"):
        return True, None
    if text in ("true", "false"):
        return True, text == "true"
    try:
        return True, float(text)
    except ValueError:
        return (bool(re.fullmatch(r"[\w.]+", text)) and cell.startswith(("`", '"'))), text


def test_marked_option_tables_name_every_declared_option_and_its_default():
    from scaffold_core.plugins import get_registry

    tables, registry, problems = _option_tables(), get_registry(), []
    assert len(tables) >= 10
    for where, kind, name, rows in tables:
        if name not in registry.names(kind):
            continue
        declared = {o.name: o for o in option_table(registry.get(kind, name).factory)}
        listed = {option: default for options, default in rows for option in options}
        problems += [f"{where}: {kind} {name!r} has no option {o!r}" for o in listed if o not in declared]
        problems += [f"{where}: {kind} {name!r} option {o!r} is not in the table" for o in declared if o not in listed]
        for option, cell in listed.items():
            plain, value = _literal(cell)
            default = declared[option].default if option in declared else ...
            if plain and default is not ... and value != (float(default) if isinstance(default, (int, float))
                                                          and not isinstance(default, bool) else default):
                problems.append(f"{where}: {kind} {name!r} option {option!r}: the table says {cell}, "
                                f"the declaration {default!r}")
    assert problems == []
