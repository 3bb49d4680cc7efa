"""The docs cannot drift: every hookspec is documented with its exact signature, every config key with
its type and default, and the tutorial's commands and files, run as written, work."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from pathlib import Path

import pytest

from scaffold_core.config import BUILTIN_DEFAULTS, CORE_KEYS, SECTIONS, OutputConfig, RolloutConfig, SamplingConfig
from scaffold_core.plugins import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"
HOOKS = [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "scaffold_spec")]


# -- hooks.md ----------------------------------------------------------------------


def signature_text(fn) -> str:
    """``name(arg: Annotation, ...) -> Return`` as written in hookspecs.py (annotations are strings there)."""
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" if p.annotation is not p.empty else p.name
                       for p in sig.parameters.values())
    ret = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    return f"{fn.__name__}({params}){ret}"


def test_hookspecs_are_found():
    assert {"register_tasks", "register_engines", "on_episode_end", "engine_request"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hookspec_has_a_docstring_describing_its_arguments(hook):
    fn = getattr(hookspecs, hook)
    doc = inspect.getdoc(fn)
    assert doc and len(doc) > 40, f"hookspec {hook} needs a docstring"
    for arg in inspect.signature(fn).parameters:
        assert f":param {arg}:" in doc, f"hookspec {hook}: document its argument {arg!r} with ':param {arg}:'"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hookspec_is_in_hooks_md_with_its_exact_signature(hook):
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    heading = f"### `{signature_text(getattr(hookspecs, hook))}`"
    assert heading in text.splitlines(), f"docs/hooks.md lacks the heading {heading}"


def test_hooks_md_documents_only_real_hooks():
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    documented = re.findall(r"^### `(\w+)\(", text, flags=re.M)
    assert sorted(documented) == sorted(HOOKS)


# -- config.md ----------------------------------------------------------------------


def type_text(annotation) -> str:
    """The words config.md uses for a type: integer, number, string or null, 'local' or 'ray', ..."""
    if annotation is typing.Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_text(a) for a in rest) + (" or null" if len(rest) < len(args) else "")
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}s"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(annotation, str(annotation))


def config_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """heading -> {key: (type, default)} for every table of config.md."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    heading = None
    for line in (DOCS / "config.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip().strip("`")
            continue
        row = re.match(r"^\| `(\w+)` \| ([^|]+?) \| (.+?) \| .* \|$", line)
        if row and heading:
            tables.setdefault(heading, {})[row.group(1)] = (row.group(2), row.group(3))
    return tables


def test_config_md_has_every_section():
    tables = config_tables()
    assert set(SECTIONS) <= set(tables), f"docs/config.md lacks sections {set(SECTIONS) - set(tables)}"


@pytest.mark.parametrize("section, model", [("sampling", SamplingConfig), ("rollout", RolloutConfig),
                                            ("output", OutputConfig)])
def test_config_md_keys_types_and_defaults_match_the_models(section, model):
    documented = config_tables()[section]
    assert set(documented) == set(model.model_fields), f"{section}: documented keys differ from the model"
    for key, field in model.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default
        assert documented[key] == (type_text(field.annotation), f"`{json.dumps(default)}`"), f"{section}.{key}"


def test_config_md_component_sections_match_the_defaults():
    tables = config_tables()
    for section in ("task", "controller", "engine", "verifier", "trajectory"):
        assert "name" in tables[section], f"{section}.name is not documented"
    for section, defaults in BUILTIN_DEFAULTS.items():
        for key, value in defaults.items():
            assert tables[section][key][1] == f"`{json.dumps(value)}`", f"{section}.{key}"
    for section, keys in CORE_KEYS.items():
        assert set(keys) <= set(tables[section])


def test_config_md_documents_every_option_of_every_builtin():
    from scaffold_core.testing import plugin_set

    tables = config_tables()
    section_of = {"controller": "controller", "engine": "engine", "verifier": "verifier",
                  "trajectory_maker": "trajectory"}
    registry = plugin_set().registry
    for kind, section in section_of.items():
        for info in registry.components(kind):
            heading = f"{section}: {info.name}"
            text = (DOCS / "config.md").read_text(encoding="utf-8")
            assert f"### `{heading}`" in text, f"docs/config.md lacks a heading for {heading}"
            factory = info.factory
            hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
            params = {n: p for n, p in inspect.signature(factory).parameters.items()
                      if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
            documented = tables.get(heading, {})
            assert set(documented) == set(params), f"{heading}: documented options differ from the signature"
            for name, param in params.items():
                expected = (type_text(hints.get(name, typing.Any)), f"`{json.dumps(param.default)}`")
                assert documented[name] == expected, f"{heading}.{name}"


def test_docs_link_only_to_docs_that_exist():
    for page in DOCS.glob("*.md"):
        for ref in re.findall(r"docs/([\w-]+\.md)", page.read_text(encoding="utf-8")):
            assert (DOCS / ref).is_file(), f"{page.name} refers to docs/{ref}, which does not exist"


# -- tutorial.md ----------------------------------------------------------------------

BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)


def tutorial_steps() -> list[tuple[str, str, str]]:
    """("bash", script, expected output or "") and ("file", path, content), in the tutorial's order.

    A ``text`` block right after a ``bash`` block is that block's expected output.
    """
    steps: list[tuple[str, str, str]] = []
    for match in BLOCK.finditer((DOCS / "tutorial.md").read_text(encoding="utf-8")):
        lang, info, body = match.group(1), match.group(2), match.group(3)
        target = re.search(r"file=(\S+)", info)
        if target:
            steps.append(("file", target.group(1), body))
        elif lang == "bash":
            steps.append(("bash", body, ""))
        elif lang == "text" and steps and steps[-1][0] == "bash" and not steps[-1][2]:
            steps[-1] = ("bash", steps[-1][1], body)
    return steps


def test_tutorial_has_commands_and_files():
    kinds = [kind for kind, _, _ in tutorial_steps()]
    assert kinds.count("bash") >= 5 and kinds.count("file") >= 4


@pytest.mark.slow
def test_tutorial_runs_as_written():
    """A fresh venv with the core (non-editable) and pip; the tutorial's blocks, in order, in a temp folder."""
    from scaffold_core.testing.freshenv import FreshVenv

    repo = DOCS.parent
    with FreshVenv.create() as venv:
        venv.install_project(repo, "pip")
        work = venv.root / "tutorial"
        work.mkdir()
        for number, (kind, first, second) in enumerate(tutorial_steps(), start=1):
            if kind == "file":
                path = work / first
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(second, encoding="utf-8")
                continue
            result = venv.run(["bash", "-e", "-o", "pipefail", "-c", first], cwd=work, timeout=600, check=False)
            assert result.returncode == 0, (
                f"tutorial block {number} failed:\n{first}\n--- stdout ---\n{result.stdout[-4000:]}\n"
                f"--- stderr ---\n{result.stderr[-4000:]}")
            if second:
                assert result.stdout == second, f"tutorial block {number} printed:\n{result.stdout}"
        metrics = json.loads((work / "runs" / "smoke" / "metrics.json").read_text())
        assert metrics["episodes"] == 4 and metrics["failed"] == 0


# -- plugins.md ----------------------------------------------------------------------


def test_trace_plugins_shows_loading_and_registration(tmp_path):
    """The debugging aid plugins.md documents: SCAFFOLD_TRACE_PLUGINS=1 traces loading and registration."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SCAFFOLD_TRACE_PLUGINS": "1", "SCAFFOLD_EXTRA_PLUGINS": "scaffold_core.testing.plugin"}
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # the trace goes to stderr only
    lines = [line for line in proc.stderr.splitlines() if line.startswith("scaffold-trace: ")]
    assert "scaffold-trace: builtin:controllers: register_controllers added native, majority_vote, best_of_n" in lines
    assert "scaffold-trace: builtin:verifiers: register_verifiers added exact_match" in lines
    listed = {p["name"] for p in json.loads(proc.stdout)}
    assert "scaffold-trace: loaded extra plugin 'scaffold_core.testing.plugin'" in lines
    for name in listed - {"scaffold_core.testing.plugin"}:
        assert any(line.startswith(f"scaffold-trace: loaded plugin {name!r}") for line in lines), name
