"""``scaffold new-plugin`` (a command of the test kit, the kit a plugin's tests use): generate a ready-to-install
plugin package from the templates in ``templates/``.

One name everywhere: ``NAME`` becomes the distribution ``scaffold-NAME``, the
module ``scaffold_NAME`` (dashes become underscores), the entry point
``NAME`` and the component's registered name (what a YAML config selects).
The package is written to a temporary folder first and moved into place at
the end, so a failure never leaves half a plugin, and an existing folder is
never touched.
"""

from __future__ import annotations

import keyword
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from scaffold_core._meta import version
from scaffold_core.errors import NewPluginError
from scaffold_core.plugins import KINDS, PluginSet, hookimpl


@dataclass(frozen=True)
class KindTemplate:
    """How one component kind is generated."""

    module: str  # the component's module inside the package
    suffix: str  # class-name suffix
    summary: str  # what the generated component does


KIND_TEMPLATES: dict[str, KindTemplate] = {
    "task": KindTemplate("task", "Task",
                         "a task of a few inline arithmetic rows, scored by the built-in exact_match verifier"),
    "verifier": KindTemplate("verifier", "Verifier",
                             "a verifier that rewards the last number of a response when it equals the reference"),
    "engine": KindTemplate("engine", "Engine",
                           "a deterministic engine without a model that echoes the last user message"),
    "controller": KindTemplate("controller", "Controller",
                               "a controller that retries until the verifier accepts an answer"),
    "trajectory_maker": KindTemplate("trajectory", "TrajectoryMaker",
                                     "a trajectory maker with leave-one-out (RLOO) advantages"),
}

NAME_RE = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
MAX_NAME = 40
#: Files every plugin gets: template -> path inside the package folder.
COMMON_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "gitignore.tmpl": ".gitignore",
    "init.py.tmpl": "{package}/__init__.py",
}
#: Files of one kind: template -> path inside the package folder.
KIND_FILES = {
    "component.py.tmpl": "{package}/{component_module}.py",
    "test.py.tmpl": "tests/test_{package}.py",
    "example.yaml.tmpl": "example.yaml",
}
PLACEHOLDER = re.compile(r"\{\{ *([a-z_]+) *\}\}")


@dataclass(frozen=True)
class PluginNames:
    """Every name derived from the plugin's short name."""

    name: str  # entry point and component name
    distribution: str  # scaffold-NAME
    package: str  # scaffold_NAME
    class_name: str  # e.g. ArithTask

    @classmethod
    def from_name(cls, name: str, kind: str) -> PluginNames:
        validate_name(name)
        suffix = KIND_TEMPLATES[kind].suffix
        camel = "".join(part.capitalize() for part in re.split(r"[-_]", name))
        class_name = camel if camel.endswith(suffix) else camel + suffix
        return cls(name, f"scaffold-{name}", f"scaffold_{name.replace('-', '_')}", class_name)


def validate_name(name: str) -> None:
    """Raise :class:`NewPluginError` naming what is wrong with ``name`` and what would be right."""
    if name.startswith(("scaffold-", "scaffold_")):
        short = name.split("-", 1)[-1] if name.startswith("scaffold-") else name.split("_", 1)[-1]
        raise NewPluginError(
            f"plugin name {name!r}: give the short name, e.g. {short!r}; the distribution is named "
            f"scaffold-{short} and the module scaffold_{short.replace('-', '_')} for you")
    if not NAME_RE.match(name):
        raise NewPluginError(
            f"plugin name {name!r} is not valid: use lowercase letters and digits, starting with a letter, "
            "with single '-' or '_' between words (e.g. 'arith', 'my-task')")
    if len(name) > MAX_NAME:
        raise NewPluginError(f"plugin name {name!r} is too long ({len(name)} characters; at most {MAX_NAME})")
    if keyword.iskeyword(name):
        raise NewPluginError(f"plugin name {name!r} is a Python keyword; pick another name")


def builtin_names(kind: str) -> list[str]:
    """Names the core already registers for ``kind`` (a plugin reusing one would conflict)."""
    return PluginSet().load(entry_points=False).registry.names(kind)


def core_range(core_version: str) -> tuple[str, str]:
    """The scaffold-core range a new plugin supports: this release series. ``0.1.3`` -> (``0.1``,
    ``0.2``) (before 1.0 a minor release may break plugins); ``1.4.0`` -> (``1.4``, ``2``)."""
    numbers = [int(n) for n in re.findall(r"\d+", core_version.split("+")[0])[:2]] + [0, 0]
    major, minor = numbers[0], numbers[1]
    floor = f"{major}.{minor}"
    return floor, (f"{major}.{minor + 1}" if major == 0 else f"{major + 1}")


def render(text: str, values: dict[str, str], source: str) -> str:
    """Fill ``{{ key }}`` placeholders; an unknown key is a bug in the template."""

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"template {source} uses unknown placeholder {key!r}")
        return values[key]

    return PLACEHOLDER.sub(fill, text)


def _template(*parts: str) -> str:
    return resources.files("scaffold_testkit").joinpath("templates", *parts).read_text(encoding="utf-8")


def plan_files(name: str, kind: str) -> dict[str, str]:
    """The generated package: relative path -> file content (nothing is written)."""
    if kind not in KIND_TEMPLATES:
        raise NewPluginError(f"unknown kind {kind!r}; kinds: {', '.join(KIND_TEMPLATES)}")
    names = PluginNames.from_name(name, kind)
    spec = KIND_TEMPLATES[kind]
    core_floor, core_ceiling = core_range(version())
    values = {
        "name": names.name,
        "distribution": names.distribution,
        "package": names.package,
        "class_name": names.class_name,
        "kind": kind,
        "kind_title": kind.replace("_", " "),
        "hook": KINDS[kind].hook,
        "component_module": spec.module,
        "summary": spec.summary,
        "core_floor": core_floor,
        "core_ceiling": core_ceiling,
    }
    values["usage"] = render(_template(kind, "usage.md.tmpl"), values, f"{kind}/usage.md.tmpl").strip()
    files: dict[str, str] = {}
    for template, target in COMMON_FILES.items():
        files[target.format(**values)] = render(_template("common", template), values, f"common/{template}")
    for template, target in KIND_FILES.items():
        files[target.format(**values)] = render(_template(kind, template), values, f"{kind}/{template}")
    return files


def create_plugin(name: str, *, kind: str = "task", parent: str | Path = ".") -> Path:
    """Write ``scaffold-NAME/`` into ``parent`` (created when missing) and return its path.

    Refuses names that are not valid, names the core already uses for that
    kind, and a target folder that exists and is not empty (an empty one is
    filled).
    """
    files = plan_files(name, kind)  # validates the name and kind first
    if name in builtin_names(kind):
        raise NewPluginError(
            f"{kind.replace('_', ' ')} {name!r} is a built-in of scaffold-core; a plugin registering it "
            "would clash with it. Pick another name")
    parent_dir = Path(parent)
    if parent_dir.exists() and not parent_dir.is_dir():
        raise NewPluginError(f"--dir {parent}: exists and is not a directory; pick another --dir")
    target = parent_dir / f"scaffold-{name}"
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise NewPluginError(f"{target} already exists and is not empty; remove it, or pick another name or --dir")
    created = _make_dirs(parent_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".scaffold-{name}-", dir=parent_dir))
    try:
        for relative, content in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        if target.is_dir():
            target.rmdir()  # empty (checked above): the staged package takes its place
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in reversed(created):  # leave no folder this call made behind
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return target


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the folders created, outermost first."""
    missing = []
    for candidate in [folder, *folder.parents]:
        if candidate.exists():
            break
        missing.append(candidate)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NewPluginError(f"--dir {folder}: cannot create it ({exc.strerror or exc}); pick another --dir") from None
    return list(reversed(missing))


def next_steps(target: Path, name: str, kind: str) -> str:
    """What to do after generating, as printed by the CLI."""
    steps = [
        (f"pip install -e '{target}[test]'", "install it (editable) with its test extra"),
        ("scaffold list-plugins", f"it is listed as {name!r}"),
        (f"pytest {target}", "its conformance tests pass out of the box"),
    ]
    width = max(len(command) for command, _ in steps)
    lines = [f"Created {target} ({kind.replace('_', ' ')} plugin {name!r}). Next:"]
    lines += [f"  {command.ljust(width)}  # {comment}" for command, comment in steps]
    lines.append(f"Then edit {target / target.name.replace('-', '_')} and see {target / 'README.md'}.")
    return "\n".join(lines)


@hookimpl
def register_commands(subparsers):
    p = subparsers.add_parser("new-plugin", help="create a ready-to-install plugin package (scaffold-NAME)")
    p.add_argument("name", help="the plugin's short name: 'arith' makes scaffold-arith, module scaffold_arith")
    p.add_argument("--kind", default="task", choices=list(KIND_TEMPLATES),
                   help="the component the plugin adds (default: task)")
    p.add_argument("--dir", default=".",
                   help="the folder to create scaffold-NAME/ in, created when missing (default: the current one)")
    p.set_defaults(handler=_new_plugin)


def _new_plugin(args) -> int:
    target = create_plugin(args.name, kind=args.kind, parent=args.dir)
    print(next_steps(target, args.name, args.kind))
    return 0
