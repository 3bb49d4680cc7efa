import json
import subprocess
import sys


def test_listed_by_scaffold_list_plugins():
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    assert plugins["gsm8k"]["status"] == "ok", plugins["gsm8k"]
    assert plugins["gsm8k"]["distribution"] == "scaffold-gsm8k"
    assert plugins["gsm8k"]["components"]["task"] == ["gsm8k", "gsm8k_calculator", "multiturn_gsm8k"]
