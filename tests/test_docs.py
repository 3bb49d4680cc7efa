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
    from scaffold_testkit import plugin_set

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
    dropped = [b["line"] for b in page_blocks(DOCS / "tutorial.md")
               if b["lang"] in ("python", "py", "sh", "shell") and "file=" not in b["info"]]
    assert not dropped, f"docs/tutorial.md: blocks at lines {dropped} are neither run nor written by its test"


@pytest.mark.slow
def test_tutorial_runs_as_written(dist_dir, uv_pip_install):
    """A fresh venv with scaffold-core and scaffold-testkit from the session's dist/ (as the tutorial installs
    them) and pip; the tutorial's blocks, in order, in a temp folder."""
    from scaffold_testkit.freshenv import FreshVenv

    with FreshVenv.create() as venv:
        work = venv.root / "tutorial"
        work.mkdir()
        uv_pip_install(venv, ["--find-links", str(dist_dir), "scaffold-core", "scaffold-testkit", "pip"], cwd=work)
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

    env = {**os.environ, "SCAFFOLD_TRACE_PLUGINS": "1", "SCAFFOLD_EXTRA_PLUGINS": "scaffold_testkit.plugin"}
    proc = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # the trace goes to stderr only
    lines = [line for line in proc.stderr.splitlines() if line.startswith("scaffold-trace: ")]
    assert "scaffold-trace: builtin:controllers: register_controllers added native, majority_vote, best_of_n" in lines
    assert "scaffold-trace: builtin:verifiers: register_verifiers added exact_match" in lines
    listed = {p["name"] for p in json.loads(proc.stdout)}
    assert "scaffold-trace: loaded extra plugin 'scaffold_testkit.plugin'" in lines
    for name in listed - {"scaffold_testkit.plugin"}:
        assert any(line.startswith(f"scaffold-trace: loaded plugin {name!r}") for line in lines), name


# -- api.md: the public names ---------------------------------------------------------------------


def api_sections() -> dict[str, str]:
    """Each name in an ``### `Name`[, `Other`]`` heading of api.md -> the text of its section."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    sections: dict[str, str] = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        body = body.split("\n## ")[0]
        for name in re.findall(r"`(\w+)`", heading):
            sections[name] = body
    return sections


def test_api_md_documents_every_public_name():
    import scaffold_core

    documented = api_sections()
    missing = [name for name in ["hookimpl", *scaffold_core._LAZY] if name not in documented]
    assert not missing, f"docs/api.md has no section for {missing}"


@pytest.mark.parametrize("name", ["Verdict", "Outcome", "EpisodeContext", "Sample", "EpisodeResult", "GenerationTask",
                                  "VerificationTask", "AwaitTask", "GenerationRequest", "GenerationResult",
                                  "SamplingParams", "TrainingSample", "Parallel", "Branch"])
def test_api_md_lists_exactly_the_fields_of_each_dataclass(name):
    import dataclasses

    import scaffold_core

    cls = getattr(scaffold_core, name)
    fields = {f.name for f in dataclasses.fields(cls)}
    section = api_sections()[name]
    mentioned = set(re.findall(r"`(\w+)`", section))
    assert fields <= mentioned, f"docs/api.md, {name}: fields not documented: {sorted(fields - mentioned)}"
    table_keys = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    if table_keys and name not in ("GenerationTask", "VerificationTask", "AwaitTask"):
        assert table_keys == fields, f"docs/api.md, {name}: the table lists {sorted(table_keys ^ fields)} wrongly"


def test_api_md_class_attributes_and_defaults_are_the_codes():
    from scaffold_core.verifier import DEFAULT_REWARD_RANGE, Verifier

    section = api_sections()["Verifier"]
    assert f"| `executor` | `\"{Verifier.executor}\"` |" in section
    assert f"| `reward_range` | `{DEFAULT_REWARD_RANGE}` |" in section


# -- every shell and Python snippet of the docs and READMEs runs ---------------------------------------
#
# The convention (docs/testing.md): blocks of a page run in order, in one temporary folder; Python blocks
# share one interpreter (like a notebook), shell blocks run with bash -e. A block with ``file=PATH`` in its
# info string is written to PATH instead. An HTML comment right before a block opts it out:
#   <!-- doc-test: skip: REASON -->              not runnable here, for REASON (a model, a GPU, the network)
#   <!-- doc-test: run-by: tests/FILE.py::TEST --> another test runs it (TEST checks it as written)
# and ``<!-- doc-test: page run-by: tests/FILE.py::TEST -->`` on a line of its own hands the whole page over.

REPO = DOCS.parent
SHELL_LANGS = {"bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
MARKER = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->", re.S)
SNIPPET_TIMEOUT = 240


def doc_pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), REPO / "README.md", *sorted(REPO.glob("plugins/*/README.md"))]


def page_blocks(page: Path) -> list[dict]:
    """Every fenced block of a page: lang, info, body, line, and the doc-test marker right before it."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()].rstrip()
        marker = None
        if before.endswith("-->"):
            found = list(MARKER.finditer(before))
            if found and found[-1].end() == len(before) and (found[-1].start() == 0
                                                             or before[found[-1].start() - 1] == "\n"):
                marker = found[-1].group(1)  # a comment on a line of its own, right before the block
        blocks.append({"lang": match.group(1), "info": match.group(2).strip(), "body": match.group(3),
                       "line": text[:match.start()].count("\n") + 1, "marker": marker})
    return blocks


def page_handed_over(page: Path) -> str | None:
    found = re.search(r"^<!--\s*doc-test:\s*page run-by:\s*(\S+)\s*-->$", page.read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else None


def check_run_by(target: str, where: str) -> None:
    path, _, test = target.partition("::")
    file = REPO / path
    assert file.is_file() and test and f"def {test}(" in file.read_text(encoding="utf-8"), (
        f"{where}: run-by names {target}, which does not exist")


def runnable(block: dict) -> bool:
    return block["lang"] in SHELL_LANGS | PYTHON_LANGS and "file=" not in block["info"]


#: Commands that would change the environment the doc test runs in (or run the suite itself).
ENVIRONMENT_CHANGING = re.compile(r"^\s*(?:\S+=\S+\s+)*(?:pip3?|uv\s+pip|python3?\s+-m\s+pip)\s+(?:install|uninstall)\b"
                                  r"|^\s*make\b", re.M)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_snippet_is_runnable_or_says_why_not(page):
    """The markers are well formed: a skip gives its reason; a run-by names a test that exists."""
    handed = page_handed_over(page)
    if handed:
        check_run_by(handed, str(page))
        return  # that test runs every block, in an environment of its own
    for block in page_blocks(page):
        where = f"{page.relative_to(REPO)}:{block['line']}"
        marker = block["marker"]
        if marker is None:
            assert not (block["lang"] in SHELL_LANGS and ENVIRONMENT_CHANGING.search(block["body"])), (
                f"{where}: a block that installs packages or runs make must be marked: it would change the "
                "environment the docs are tested in (<!-- doc-test: skip: REASON --> or run-by: TEST)")
            continue
        kind, _, rest = marker.partition(":")
        kind = kind.strip()
        assert kind in ("skip", "run-by"), f"{where}: unknown doc-test marker {marker!r} (skip: REASON, run-by: TEST)"
        assert runnable(block), f"{where}: a doc-test marker on a {block['lang']} block, which never runs"
        if kind == "skip":
            assert len(rest.strip()) >= 10, (
                f"{where}: say why the block is not runnable: <!-- doc-test: skip: REASON -->")
        else:
            check_run_by(rest.strip(), where)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_code_block_names_its_language(page):
    """An unlabelled fence would hide a shell snippet from the doc test: ```bash, ```python, ```text, ..."""
    fences = [(n, line) for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
              if line.startswith("```")]
    unlabelled = [n for (n, line) in fences[0::2] if line.strip() == "```"]
    assert len(fences) % 2 == 0, f"{page}: an unclosed code fence"
    assert not unlabelled, f"{page}: code blocks without a language at lines {unlabelled}"


class PythonSession:
    """One interpreter for a page's Python blocks: each block runs in the namespace the previous ones left."""

    DRIVER = (
        "import contextlib, io, json, sys, traceback\n"
        "namespace = {'__name__': '__main__'}\n"
        "for line in sys.stdin:\n"
        "    request = json.loads(line)\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            exec(compile(request['code'], request['name'], 'exec'), namespace)\n"
        "        reply = {'ok': True, 'stdout': out.getvalue()}\n"
        "    except BaseException:\n"
        "        reply = {'ok': False, 'stdout': out.getvalue(), 'error': traceback.format_exc()}\n"
        "    sys.__stdout__.write(json.dumps(reply) + '\\n')\n"
        "    sys.__stdout__.flush()\n"
    )

    def __init__(self, cwd: Path, env: dict[str, str]):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", self.DRIVER], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def run(self, code: str, name: str, timeout: float) -> dict:
        import queue
        import threading

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "name": name}) + "\n")
        self.proc.stdin.flush()
        replies: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: replies.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = replies.get(timeout=timeout)
        except queue.Empty:
            self.close()
            return {"ok": False, "stdout": "", "error": f"did not finish within {timeout:g} s"}
        if not line:
            return {"ok": False, "stdout": "", "error": f"the interpreter died: {self.proc.stderr.read()[-3000:]}"}
        return json.loads(line)

    def close(self) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.communicate()


def snippet_env(work: Path) -> dict[str, str]:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "SCAFFOLD_CACHE_DIR": str(work / ".cache" / "scaffold"),
                "HF_DATASETS_CACHE": str(work / ".cache" / "hf"),
                "SCAFFOLD_DISABLE_PLUGINS": "", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


@pytest.mark.parametrize("page", [p for p in doc_pages() if not page_handed_over(p)
                                  and any(runnable(b) and b["marker"] is None for b in page_blocks(p))],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_snippets_run(page, tmp_path):
    """A page's unmarked shell and Python blocks, in order, in a temp folder (``examples/`` of the repository
    at hand), offline; ``file=`` blocks are written first where they stand."""
    from scaffold_testkit.freshenv import run_bounded

    work = tmp_path / "page"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    env = snippet_env(work)
    session: PythonSession | None = None
    try:
        for block in page_blocks(page):
            where = f"{page.relative_to(REPO)}:{block['line']}"
            target = re.search(r"file=(\S+)", block["info"])
            if target:
                path = work / target.group(1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block["body"], encoding="utf-8")
                continue
            if not runnable(block) or block["marker"] is not None:
                continue
            if block["lang"] in SHELL_LANGS:
                assert not ENVIRONMENT_CHANGING.search(block["body"]), f"{where}: installs packages; mark it"
                result = run_bounded(["bash", "-e", "-o", "pipefail", "-c", block["body"]], cwd=work, env=env,
                                     timeout=SNIPPET_TIMEOUT, check=False)
                assert result.returncode == 0, (f"{where} failed:\n{block['body']}\n--- stdout ---\n"
                                                f"{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}")
            else:
                session = session or PythonSession(work, env)
                reply = session.run(block["body"], where, SNIPPET_TIMEOUT)
                assert reply["ok"], f"{where} failed:\n{block['body']}\n{reply['error'][-3000:]}"
    finally:
        if session is not None:
            session.close()


def test_the_readme_lists_every_doc_once_and_says_to_activate_the_venv():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(docs/[\w-]+\.md)`", readme, re.M)
    rows = re.findall(r"^\| (`docs/[^|]+)\|", readme, re.M)
    listed += [d for row in rows for d in re.findall(r"`(docs/[\w-]+\.md)`", row)[1:]]
    assert len(listed) == len(set(listed)), "a doc is listed twice in the README's table"
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} <= set(listed) | {"docs/README.md"}
    assert "source .venv/bin/activate" in readme


def test_the_embedded_engines_install_says_how_to_get_the_cpu_build_of_torch():
    cpu = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    for page in (REPO / "README.md", DOCS / "runtime.md"):  # the install line, and the engine's section
        assert cpu in page.read_text(encoding="utf-8").replace("\n", " "), page.name


def test_the_readme_names_every_plugin_in_the_repository():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((REPO / "plugins").glob("scaffold-*")) if f"plugins/{p.name}`" not in readme]
    assert missing == []
