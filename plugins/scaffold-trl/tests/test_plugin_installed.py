import json
import subprocess
import sys


def test_listed_by_scaffold_list_plugins_with_its_trainer():
    out = subprocess.run([sys.executable, "-m", "scaffold_core.cli", "list-plugins", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    trl = plugins["trl"]
    assert trl["status"] == "ok", trl
    assert trl["distribution"] == "scaffold-trl"
    assert "register_trainers" in trl["hooks"] and trl["components"]["trainer"] == ["trl"]


def test_importing_the_plugin_does_not_import_trl():
    code = "import sys, scaffold_trl; print('trl' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
