"""Plugin discovery through real entry points: fixture distributions pip-installed into a temp dir."""

from __future__ import annotations

import json
import re
import sys

import yaml

#: The fixtures that reuse other plugins' names (dupe: 'hello'; clash: the built-in 'native' and scaffold-gsm8k's
#: 'gsm8k') make those names ambiguous; they are enabled only where clashes are tested.
ISOLATE = "dupe,clash"


def test_project_plugins_are_listed_ok_with_versions(list_plugins):
    plugins = list_plugins()
    for name in ("gsm8k", "multiturn", "sglang"):
        assert plugins[name]["status"] == "ok", plugins[name]
        assert plugins[name]["distribution"] == f"scaffold-{name}"
        assert plugins[name]["version"]


def test_listing_json_shape_and_builtins_only_with_all(list_plugins):
    default = list_plugins()
    assert "builtin" not in default
    everything = list_plugins(None, "", "--all")
    builtin = everything["builtin"]
    assert builtin["distribution"] == "scaffold-core"
    assert set(builtin) == {"name", "distribution", "version", "status", "error", "hooks", "components", "clashes",
                            "notes"}
    assert builtin["status"] == "ok" and builtin["clashes"] == []
    assert set(builtin["components"]) >= {"task", "controller", "verifier", "engine", "trajectory_maker"}
    assert {"native", "majority_vote", "best_of_n"} <= set(builtin["components"]["controller"])
    assert {"single_turn", "grpo"} <= set(builtin["components"]["trajectory_maker"])


def test_third_party_plugin_is_listed_and_selectable_by_name(fixture_site, tmp_path, cli, list_plugins):
    plugins = list_plugins(fixture_site, ISOLATE)
    hello = plugins["hello"]
    assert hello["status"] == "ok" and hello["error"] is None
    assert hello["distribution"] == "scaffold-hello" and hello["version"] == "1.2.3"
    assert hello["components"]["task"] == ["hello"]
    assert hello["components"]["verifier"] == ["hello_exact"]
    assert sorted(hello["hooks"]) == ["register_tasks", "register_verifiers"]

    config = tmp_path / "hello.yaml"
    config.write_text("task: {name: hello, limit: 2}\nengine: {name: benchmark_canned, response: '#### 42'}\n")
    proc = cli("run", str(config), "-o", str(tmp_path / "out"), "--no-progress", site=fixture_site,
                        disable=ISOLATE)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["completed"] == 2 and metrics["accuracy"] == 1.0  # the task's default verifier was used


def test_plugin_that_fails_to_import_is_listed_as_error_and_others_keep_working(fixture_site, cli, list_plugins):
    plugins = list_plugins(fixture_site, ISOLATE)
    broken = plugins["broken"]
    assert broken["status"] == "error"
    assert "scaffold_missing_dependency_xyz" in broken["error"]
    assert broken["distribution"] == "scaffold-broken"
    assert plugins["hello"]["status"] == "ok"
    assert plugins["gsm8k"]["status"] == "ok"


def test_selecting_a_component_of_a_broken_plugin_names_it_and_its_cause(fixture_site, tmp_path, cli, list_plugins):
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: broken}\n")
    proc = cli("config", str(config), site=fixture_site, disable=ISOLATE)
    assert proc.returncode == 1
    assert "plugin 'broken'" in proc.stderr and "failed to load" in proc.stderr
    assert "scaffold_missing_dependency_xyz" in proc.stderr


def test_duplicate_names_are_reported_and_never_resolved_silently(fixture_site, tmp_path, cli, list_plugins):
    plugins = list_plugins(fixture_site, "clash")
    for name in ("hello", "dupe"):
        assert plugins[name]["status"] == "clash"
        [clash] = plugins[name]["clashes"]
        assert (clash["kind"], clash["name"]) == ("task", "hello")
        assert sorted(p["distribution"] for p in clash["providers"]) == ["scaffold-dupe", "scaffold-hello"]
    assert plugins["hello"]["components"]["verifier"] == ["hello_exact"]  # its other components are listed
    listed = cli("list-plugins", site=fixture_site, disable="clash")
    assert listed.returncode == 0
    assert "name clash: task 'hello' is registered by 2 plugins" in listed.stderr
    assert "scaffold-hello" in listed.stderr and "scaffold-dupe" in listed.stderr

    config = tmp_path / "c.yaml"
    config.write_text("task: {name: hello}\nengine: {name: benchmark_canned}\n")
    proc = cli("config", str(config), site=fixture_site, disable="clash")
    assert proc.returncode == 1
    assert "task.name: task 'hello' is registered by 2 plugins" in proc.stderr
    assert "plugin 'hello' (scaffold-hello)" in proc.stderr and "plugin 'dupe' (scaffold-dupe)" in proc.stderr
    assert "`name: hello:hello`" in proc.stderr and "`name: scaffold-dupe:hello`" in proc.stderr
    assert "SCAFFOLD_DISABLE_PLUGINS=dupe" in proc.stderr

    # the ways out the error names all work: a qualified name (plugin or distribution), or disabling one
    for qualified in ("hello:hello", "scaffold-hello:hello", "scaffold_hello:hello"):
        chosen = cli("config", str(config), "--set", f"task.name={qualified}", site=fixture_site, disable="clash")
        assert chosen.returncode == 0, chosen.stderr
        assert yaml.safe_load(chosen.stdout)["verifier"]["name"] == "hello_exact"  # scaffold-hello's task defaults
    assert cli("config", str(config), site=fixture_site, disable="clash,dupe").returncode == 0
    wrong = cli("config", str(config), "--set", "task.name=nope:hello", site=fixture_site, disable="clash")
    assert wrong.returncode == 1 and "no plugin or distribution 'nope' provides task 'hello'" in wrong.stderr


def test_a_plugin_reusing_a_builtin_name_hides_nothing(fixture_site, tmp_path, cli, list_plugins):
    """scaffold-clash registers controller 'native' and task 'gsm8k': neither it nor the built-in (or
    scaffold-gsm8k) wins silently; the clash is listed; other names keep working."""
    plugins = list_plugins(fixture_site, "dupe", "--all")
    assert plugins["clash"]["status"] == "clash" and plugins["builtin"]["status"] == "clash"
    clashes = {(c["kind"], c["name"]): c["providers"] for c in plugins["clash"]["clashes"]}
    assert clashes[("controller", "native")] == [{"plugin": "builtin", "distribution": "scaffold-core"},
                                                 {"plugin": "clash", "distribution": "scaffold-clash"}]
    assert {"plugin": "gsm8k", "distribution": "scaffold-gsm8k"} in clashes[("task", "gsm8k")]
    assert "native" in plugins["builtin"]["components"]["controller"]  # the built-in is still there
    assert plugins["gsm8k"]["status"] == "clash"
    assert plugins["gsm8k"]["components"]["verifier"] == ["gsm8k", "math_verify"]

    config = tmp_path / "c.yaml"
    config.write_text("task: {name: hello}\nengine: {name: benchmark_canned}\n")
    proc = cli("config", str(config), site=fixture_site, disable="dupe")  # the default controller is 'native'
    assert proc.returncode == 1
    assert "controller.name: controller 'native' is registered by 2 plugins: the built-in (scaffold-core) and " \
           "plugin 'clash' (scaffold-clash)" in proc.stderr
    assert "`name: builtin:native`" in proc.stderr and "SCAFFOLD_DISABLE_PLUGINS=clash" in proc.stderr
    ok = cli("config", str(config), "--set", "controller.name=builtin:native", site=fixture_site, disable="dupe")
    assert ok.returncode == 0, ok.stderr
    run = cli("run", str(config), "--set", "controller.name=clash:native", "--set", "task.limit=1", "-o",
              str(tmp_path / "out"), "--no-progress", site=fixture_site, disable="dupe")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "metrics.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "out"]


def test_misspelled_hookimpl_is_caught(fixture_site, cli, list_plugins):
    typo = list_plugins(fixture_site, ISOLATE)["typo"]
    assert typo["status"] == "error"
    assert "register_task" in typo["error"] and "did you mean 'register_tasks'" in typo["error"]


def test_plugin_raising_in_register_hook_is_an_error_and_registers_nothing(fixture_site, tmp_path, cli, list_plugins):
    plugins = list_plugins(fixture_site, ISOLATE)
    assert plugins["raiser"]["status"] == "error"
    assert "config file is missing" in plugins["raiser"]["error"]
    assert plugins["hello"]["status"] == "ok"
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: hello}\nverifier: {name: raiser_ok}\n")
    proc = cli("config", str(config), site=fixture_site, disable=ISOLATE)
    assert proc.returncode == 1 and "plugin 'raiser'" in proc.stderr and "config file is missing" in proc.stderr


def test_disabled_plugins_are_not_imported(fixture_site, cli, list_plugins):
    plugins = list_plugins(fixture_site, "broken,dupe,clash")
    assert plugins["broken"]["status"] == "disabled"
    assert "SCAFFOLD_DISABLE_PLUGINS" in plugins["broken"]["error"]


def test_unknown_component_suggests_close_name_and_install_hint(fixture_site, tmp_path, cli):
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: helo}\n")
    proc = cli("config", str(config), site=fixture_site, disable=ISOLATE)
    assert proc.returncode == 1
    assert str(config) in proc.stderr and "task.name" in proc.stderr
    # other installed plugins (the workspace's own, e.g. gsm8k) may list their tasks too
    assert "unknown task 'helo'" in proc.stderr and re.search(r"Installed tasks: [^.]*\bhello\b", proc.stderr)
    assert "Did you mean 'hello'?" in proc.stderr
    assert "pip install scaffold-" not in proc.stderr  # no package name is made up from a misspelt component name
    disabled = cli("config", str(config), "--set", "task.name=gsm8k", site=fixture_site, disable=f"{ISOLATE},gsm8k")
    assert disabled.returncode == 1
    assert ("It may come from plugin 'gsm8k' (scaffold-gsm8k), which is installed but disabled by "
            "SCAFFOLD_DISABLE_PLUGINS") in disabled.stderr


def test_list_plugins_imports_no_heavy_library():
    code = ("import sys, io, contextlib; from scaffold_core.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['list-plugins', '--json', '--all'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'sglang', 'datasets') if m in sys.modules]\n"
            "print(heavy)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
