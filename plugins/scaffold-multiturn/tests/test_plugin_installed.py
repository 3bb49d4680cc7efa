import json
import subprocess
import sys


def test_listed_by_scaffold_list_plugins():
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    assert plugins["multiturn"]["status"] == "ok", plugins["multiturn"]
    assert plugins["multiturn"]["distribution"] == "scaffold-multiturn"
    components = plugins["multiturn"]["components"]
    assert components["controller"] == ["agent", "multiturn_chat"]
    assert components["tool_format"] == ["hermes", "native"]
    assert components["environment"] == ["simulated_user", "verifier_feedback"]
    assert components["trajectory_maker"] == ["multiturn"]
    assert components["task"] == []  # the GSM8K tasks these run on come with scaffold-gsm8k


def test_registering_imports_no_heavy_library():
    """`scaffold list-plugins` stays fast: registering the plugin's components loads no torch/transformers."""
    code = ("import sys, scaffold_multiturn\n"
            "from scaffold_testkit import plugin_set\n"
            "plugin_set(multiturn=scaffold_multiturn)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
