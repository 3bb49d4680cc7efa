from scaffold_testkit.installed import listed_plugin, modules_loaded


def test_listed_by_scaffold_list_plugins():
    entry = listed_plugin("vllm")
    assert entry["status"] == "ok", entry
    assert entry["distribution"] == "scaffold-vllm"


def test_importing_the_plugin_loads_nothing_heavy():
    assert modules_loaded(["scaffold_vllm"], ["vllm", "torch", "transformers", "aiohttp"]) == []
