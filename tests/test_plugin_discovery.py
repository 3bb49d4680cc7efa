"""Plugin discovery through real entry points: fixture distributions pip-installed into a temp dir."""

from __future__ import annotations

import json
import re
import sys

ISOLATE = "dupe"  # the duplicate-name fixture would make every lookup of 'hello' fail; enable it only where tested


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
    assert set(builtin) == {"name", "distribution", "version", "status", "error", "hooks", "components"}
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


def test_duplicate_names_error_names_both_distributions(fixture_site, tmp_path, cli, list_plugins):
    plugins = list_plugins(fixture_site, "")
    for name in ("hello", "dupe"):
        assert plugins[name]["status"] == "error"
        assert "scaffold-hello" in plugins[name]["error"] and "scaffold-dupe" in plugins[name]["error"]
    config = tmp_path / "c.yaml"
    config.write_text("task: {name: hello}\n")
    proc = cli("config", str(config), site=fixture_site, disable="")
    assert proc.returncode == 1
    assert "registered twice" in proc.stderr
    assert "scaffold-hello" in proc.stderr and "scaffold-dupe" in proc.stderr


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
    plugins = list_plugins(fixture_site, "broken,dupe")
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
    assert "pip install scaffold-helo" in proc.stderr


def test_list_plugins_imports_no_heavy_library():
    code = ("import sys, io, contextlib; from scaffold_core.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['list-plugins', '--json', '--all'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'sglang', 'datasets') if m in sys.modules]\n"
            "print(heavy)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
