import json
import subprocess
import sys


def test_listed_by_scaffold_list_plugins():
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    assert plugins["multiturn"]["status"] == "ok", plugins["multiturn"]
    assert plugins["multiturn"]["distribution"] == "scaffold-multiturn"
