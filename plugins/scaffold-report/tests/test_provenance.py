"""Every run, eval and train directory records what produced it (model, weights fingerprint, tokenizer, engine
and its options, seed, versions) in provenance.json, and its report shows it at the top."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

from scaffold_core.cli import main
from scaffold_core.run.provenance import model_provenance, provenance, weights_fingerprint
from scaffold_report.build import build_report


def _summary(html: str) -> str:
    return re.search(r'<section id="summary">.*?</section>', html, re.S).group(0)


def test_a_run_records_its_provenance_and_its_report_shows_it_first(test_plugins, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("task: {name: arithmetic, count: 3}\nengine: {name: benchmark_canned, response: '#### 4'}\n"
                      "sampling: {seed: 1234}\nrollout: {progress: false}\n")
    assert main(["run", str(config), "-o", str(tmp_path / "run")]) == 0
    record = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert record["seed"] == 1234
    assert record["engine"]["name"] == "benchmark_canned" and record["engine"]["options"] == {"response": "#### 4"}
    assert "response" not in record["engine"]["defaults"]  # the options left at their defaults, apart
    assert record["engine"]["defaults"] and all(not isinstance(v, (dict, list)) for v in
                                                 record["engine"]["defaults"].values())
    assert record["versions"]["components"]["task"]["name"] == "arithmetic"
    assert record["versions"]["scaffold-core"] and "model" in record
    summary = _summary((tmp_path / "run" / "report.html").read_text())
    header = re.search(r'<div class="provenance".*?</div>', summary, re.S)
    assert header and summary.index('class="provenance"') < summary.index('class="cards"')
    assert "benchmark_canned" in header.group(0) and "1234" in header.group(0)


def test_a_train_directory_records_its_provenance(test_plugins, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("task: {name: arithmetic, count: 2}\nengine: {name: benchmark_canned, response: '4'}\n"
                      "trainer: {name: rollout_only, steps: 1, group: 2}\n")
    assert main(["train", str(config), "-o", str(tmp_path / "t"), "--no-progress"]) == 0
    record = json.loads((tmp_path / "t" / "provenance.json").read_text())
    assert record["engine"]["name"] == "benchmark_canned" and record["versions"]["components"]["trainer"]
    assert 'class="provenance"' in (tmp_path / "t" / "report.html").read_text()


def test_an_eval_directory_records_its_provenance(eval_dir, dice_plugins, tmp_path):
    record = json.loads((eval_dir / "provenance.json").read_text())
    assert record["engine"]["name"] == "dice" and record["seed"] == 0
    page = build_report(eval_dir, output=tmp_path / "r.html", tokenizer=None, registry=dice_plugins.registry)
    assert 'class="provenance"' in _summary(page.read_text())


def test_the_weights_fingerprint_follows_the_bytes_not_the_clock(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"\0" * (3 << 20))
    first = weights_fingerprint(weights)
    assert first["bytes"] == 3 << 20 and first["files"] == 1
    weights.touch()
    assert weights_fingerprint(weights)["fingerprint"] == first["fingerprint"]
    weights.write_bytes(b"\0" * ((3 << 20) - 1) + b"\1")  # the last byte changed
    assert weights_fingerprint(weights)["fingerprint"] != first["fingerprint"]
    assert weights_fingerprint("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub id: nothing local


def test_the_model_comes_from_the_options_or_the_engine_that_resolved_a_default(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 10)
    (folder / "config.json").write_text("{}")
    named = model_provenance({"engine": {"name": "vllm", "model": str(folder), "revision": "abc123"}})
    assert named["name"] == str(folder) and named["revision"] == "abc123" and named["weights"]["files"] == 2
    assert named["tokenizer"] == str(folder)
    engine = SimpleNamespace(source=SimpleNamespace(location=str(folder), gguf_file=None, label=str(folder)),
                             tokenizer=SimpleNamespace(name_or_path="tok-dir"))
    resolved = model_provenance({"engine": {"name": "transformers"}}, engine)
    assert resolved["name"] == str(folder) and resolved["tokenizer"] == "tok-dir" and resolved["weights"]
    assert provenance({"engine": {"name": "x"}, "sampling": {"seed": None}})["seed"] is None
    trained = model_provenance({"engine": {"name": "transformers"}, "trainer": {"name": "trl", "policy": str(folder)}})
    assert trained["name"] == str(folder) and trained["weights"]["files"] == 2
    default = model_provenance({"engine": {"name": "transformers"}})  # no engine object: its default model
    assert default["name"] != "(the engine's default)"
