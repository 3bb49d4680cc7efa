"""The layout holds: no import cycles in the core, no import from a layer above, every module in a documented
room, and every plugin importing the core only through the modules documented as plugin-facing.

The rooms, their layers and the plugin-facing modules are read from docs/architecture.md, so the map and the
code cannot drift apart. Every import counts: top-level, inside functions, and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scaffold_core"
PLUGINS = ROOT / "plugins"
DOC = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "templates" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every scaffold_core module ``name`` imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where c is a name, not a module
                target = target.rpartition(".")[0]
            if target.startswith("scaffold_core") and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def documented_rooms() -> dict[str, int]:
    """Room (``errors.py``, ``plugins/``) -> layer, from the module map table of docs/architecture.md."""
    rooms: dict[str, int] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\|\s*(\d+)\s*\|([^|]+)\|", line)
        if match:
            for room in re.findall(r"`([^`]+)`", match.group(2)):
                rooms[room] = int(match.group(1))
    return rooms


def room_of(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    return f"{parts[0]}/" if (PACKAGE / parts[0]).is_dir() else f"{parts[0]}.py"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_modules(tmp_path):
    graph = import_graph()
    assert "scaffold_core.errors" in graph["scaffold_core.run.runtime"]
    assert "scaffold_core.plugins.markers" in graph["scaffold_core.builtins.controllers"]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles in scaffold_core:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_sits_in_a_documented_room():
    rooms = documented_rooms()
    missing = sorted({room_of(m) for m in modules()} - set(rooms))
    assert not missing, f"rooms missing from the module map in docs/architecture.md: {missing}"
    stale = sorted(set(rooms) - {room_of(m) for m in modules()})
    assert not stale, f"docs/architecture.md lists rooms that do not exist: {stale}"


def test_no_module_imports_from_a_layer_above_its_own():
    rooms = documented_rooms()
    graph = import_graph()
    upward = [f"{m} (layer {rooms[room_of(m)]}) imports {t} (layer {rooms[room_of(t)]})"
              for m, targets in graph.items() if m != "scaffold_core" for t in sorted(targets)
              if rooms[room_of(t)] > rooms[room_of(m)]]
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_only_the_facade_imports_the_package_root():
    graph = import_graph()
    offenders = sorted(m for m, targets in graph.items() if "scaffold_core" in targets)
    assert not offenders, f"these import the package facade instead of the module that defines a name: {offenders}"


def plugin_facing() -> tuple[set[str], set[str]]:
    """(modules a plugin's sources may import, modules its tests may import as well), from the "What plugins
    import" section of docs/architecture.md; a name on a line that says "and its modules" covers its submodules
    too (written ``name.*``)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## What plugins import", 1)[1].split("\n## ", 1)[0]
    sources, tests = section.split("A plugin's tests may import", 1)

    def names(part: str) -> set[str]:
        found = set()
        for line in part.splitlines():
            for name in re.findall(r"`(scaffold_core[\w.]*)`", line):
                found.add(f"{name}.*" if "and its modules" in line else name)
        return found

    return names(sources), names(tests)


def allowed(module: str, names: set[str]) -> bool:
    return module in names or any(n.endswith(".*") and (module == n[:-2] or module.startswith(n[:-1]))
                                  for n in names)


def plugin_files() -> list[Path]:
    return sorted(p for p in PLUGINS.glob("scaffold-*/**/*.py")
                  if not any(part.endswith(".egg-info") or part in ("build", ".venv") for part in p.parts))


def core_imports(path: Path, known: set[str]) -> set[str]:
    """Every ``scaffold_core`` module a plugin file imports (an import of a path that is no module stays as written,
    so that it is reported)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == "scaffold_core" or t.startswith("scaffold_core."))
    return found


def undocumented_plugin_imports(files: list[Path]) -> list[str]:
    """``file: module`` for each core module a plugin file imports that the plugin-facing lists do not name."""
    known = set(modules())
    sources, tests = plugin_facing()
    out = []
    for path in files:
        names = sources | tests if "tests" in path.relative_to(PLUGINS).parts else sources
        for target in sorted(core_imports(path, known)):
            if target not in known:
                out.append(f"{path.relative_to(ROOT)}: {target} (no such module)")
            elif not allowed(target, names):
                out.append(f"{path.relative_to(ROOT)}: {target}")
    return out


def test_the_plugin_facing_list_names_modules_that_exist():
    known = set(modules())
    sources, tests = plugin_facing()
    assert "scaffold_core.engine" in sources and "scaffold_core.config" in tests
    stale = sorted(n for n in sources | tests if n.removesuffix(".*") not in known)
    assert not stale, f"docs/architecture.md names plugin-facing modules that do not exist: {stale}"


def test_the_plugin_import_check_catches_machinery_imports(tmp_path):
    fake = tmp_path / "mod.py"
    fake.write_text("from scaffold_core import hookimpl\nfrom scaffold_core.engine import Engine\n"
                    "def f():\n    from scaffold_core.run.finalize import finalize_run_dir\n"
                    "from scaffold_core.distributed import net\nfrom scaffold_core.registry import KINDS\n",
                    encoding="utf-8")
    found = core_imports(fake, set(modules()))
    assert found == {"scaffold_core", "scaffold_core.engine", "scaffold_core.run.finalize",
                     "scaffold_core.distributed.net", "scaffold_core.registry"}
    sources, _ = plugin_facing()
    assert [m for m in sorted(found) if not allowed(m, sources)] == ["scaffold_core.registry",
                                                                       "scaffold_core.run.finalize"]


def test_plugins_import_the_core_only_through_plugin_facing_modules():
    files = plugin_files()
    assert len({p.relative_to(PLUGINS).parts[0] for p in files}) >= 7  # every plugin is looked at
    offenders = undocumented_plugin_imports(files)
    assert not offenders, ("plugins import core modules that docs/architecture.md does not list as plugin-facing "
                           "(import from a listed module, or list the module there):\n" + "\n".join(offenders))


def plugin_name_pattern() -> re.Pattern[str]:
    """``scaffold-<name>`` or ``scaffold_<name>`` for every plugin under plugins/ (the one name everywhere)."""
    names = sorted(p.name.removeprefix("scaffold-") for p in PLUGINS.glob("scaffold-*")
                   if (p / "pyproject.toml").exists())
    alternatives = "|".join(re.escape(n).replace(r"\-", "-").replace("-", "[-_]") for n in names)
    return re.compile(rf"\bscaffold[-_](?:{alternatives})\b")


def plugin_names_in_core() -> list[str]:
    pattern = plugin_name_pattern()
    return [f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
            for path in sorted(PACKAGE.rglob("*.py")) if "templates" not in path.parts
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for match in pattern.finditer(line)]


def test_the_plugin_name_check_sees_distributions_and_modules():
    pattern = plugin_name_pattern()
    assert pattern.search("pip install scaffold-skyrl-gym") and pattern.search("from scaffold_serve.cli import x")
    assert not pattern.search("scaffold-core") and not pattern.search("scaffold_core.plugins")


def test_no_core_module_names_a_plugin():
    found = plugin_names_in_core()
    assert not found, ("core modules name plugins (commands come through register_commands, install hints from "
                       "docs/plugins.md):\n" + "\n".join(found))


def cross_plugin_imports(files: list[Path], plugins: Path = PLUGINS) -> list[str]:
    """``file: module`` for each import of another plugin's submodule (anything past its package root) by a plugin's
    sources; a plugin's tests may drive neighbours they install."""
    packages = {p.name.replace("-", "_") for p in plugins.glob("scaffold-*") if (p / "pyproject.toml").exists()}
    out = []
    for path in files:
        parts = path.relative_to(plugins).parts
        own = parts[0].replace("-", "_")
        if "tests" in parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [node.module]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top in packages and top != own and target != top:
                    out.append(f"{path.relative_to(plugins.parent)}: {target}")
    return out


def test_the_cross_plugin_check_sees_submodule_imports(tmp_path):
    plugin = tmp_path / "plugins" / "scaffold-aaa" / "scaffold_aaa"
    plugin.mkdir(parents=True)
    (plugin.parent / "pyproject.toml").write_text("", encoding="utf-8")
    (tmp_path / "plugins" / "scaffold-bbb").mkdir()
    (tmp_path / "plugins" / "scaffold-bbb" / "pyproject.toml").write_text("", encoding="utf-8")
    mod = plugin / "mod.py"
    mod.write_text("import scaffold_bbb\nfrom scaffold_bbb import Public\ndef f():\n"
                   "    from scaffold_bbb.inner import x\nfrom scaffold_aaa.other import y\n", encoding="utf-8")
    found = cross_plugin_imports([mod], tmp_path / "plugins")
    assert found == ["plugins/scaffold-aaa/scaffold_aaa/mod.py: scaffold_bbb.inner"]


def test_no_plugin_imports_another_plugins_private_modules():
    offenders = cross_plugin_imports(plugin_files())
    assert not offenders, ("plugins import another plugin's private modules (import its package root, or move what "
                           "they share into a core contract):\n" + "\n".join(offenders))


#: The core's budget in lines of Python (docs/architecture.md's size table): what one command or one engine needs
#: goes to a plugin of its own.
CORE_BUDGET = 15_000


def test_the_core_stays_within_its_line_budget():
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in modules().values())
    assert lines <= CORE_BUDGET, (f"scaffold_core has {lines:,} lines of Python, over its budget of "
                                  f"{CORE_BUDGET:,}: move what one command, engine or plugin needs into that plugin")
    stated = re.search(r"\*\*the core\*\* \| \*\*([\d,]+)\*\*", DOC.read_text(encoding="utf-8"))
    assert stated, "docs/architecture.md's size table has no total"
