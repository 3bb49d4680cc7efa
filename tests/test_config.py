"""Configuration: YAML loading, --set overrides, task defaults, and every error path's message."""

from __future__ import annotations

import pytest
import yaml
from scaffold_testkit import ListTask, plugin_set

from scaffold_core import hookimpl
from scaffold_core.config import Unset, load_config
from scaffold_core.errors import ConfigError


class MathTask(ListTask):
    """A task with defaults for other sections."""

    default_config = {"sampling": {"max_tokens": 300, "temperature": 0.7}, "verifier": {"name": "exact_match"},
                      "controller": {"name": "majority_vote", "samples": 3}}

    def __init__(self, limit: int = 4, split: str = "test"):
        super().__init__([{"question": "q", "answer": "1"}] * limit)
        self.split = split


class Plugin:
    @hookimpl
    def register_tasks(self, registry):
        registry.add("math", MathTask)


#: Fixture plugins that would clash with the others: enabled only where a clash is tested.
ISOLATE = "dupe,clash"


@pytest.fixture(scope="module")
def registry():
    return plugin_set(math=Plugin()).registry


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path, registry, text: str, overrides=()):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), registry=registry)
    message = str(info.value)
    assert message.startswith(str(path)), message  # every error names the file
    return message


def test_task_defaults_fill_in_and_explicit_config_wins(tmp_path, registry):
    cfg = load_config(write(tmp_path, "task: {name: math}\nsampling: {temperature: 0.2}\n"), registry=registry)
    assert cfg.sampling.max_tokens == 300  # from the task
    assert cfg.sampling.temperature == 0.2  # explicit wins
    assert cfg.verifier.name == "exact_match"
    assert cfg.controller.name == "majority_vote" and cfg.controller.options == {"samples": 3}
    cfg = load_config(write(tmp_path, "task: {name: math}\ncontroller: {name: native}\n"), registry=registry)
    assert cfg.controller.name == "native" and cfg.controller.options == {}  # switching drops the default's options


def test_set_overrides_take_yaml_typed_values(tmp_path, registry):
    cfg = load_config(write(tmp_path, "task: {name: math}\n"),
                      ["sampling.max_tokens=64", "task.limit=2", 'sampling.stop=["\\n\\n", "####"]',
                       "rollout.progress=false", "sampling.seed=null"], registry=registry)
    assert cfg.sampling.max_tokens == 64 and cfg.task.options["limit"] == 2
    assert cfg.sampling.stop == ["\n\n", "####"]
    assert cfg.rollout.progress is False and cfg.sampling.seed is None


def test_null_and_unset_remove_a_key_so_its_default_applies(tmp_path, registry):
    path = write(tmp_path, "task: {name: math, limit: 2, split: train}\nsampling: {max_tokens: 64, seed: 3}\n"
                           "controller: {name: majority_vote, samples: 5}\nrollout: {concurrency: 3}\n")
    cfg = load_config(path, ["task.split=null", "controller.samples=~", "sampling.max_tokens=null"], registry=registry)
    assert cfg.task.options == {"limit": 2}  # the task's own default split applies
    assert cfg.controller.options == {"samples": 3}  # the task's default_config applies again
    assert cfg.sampling.max_tokens == 300  # the task's default_config applies again
    cfg = load_config(path, [Unset("sampling.seed"), Unset("rollout"), Unset("output.dir"), Unset("nothing.here")],
                      registry=registry)
    assert cfg.sampling.seed == 0 and cfg.rollout.concurrency == 64 and cfg.output.dir == "runs/{task}-{time}"
    # where null is a value of the key (no seed; progress bar on a terminal only), --set KEY=null sets it
    cfg = load_config(path, ["sampling.seed=null", "rollout.progress=null"], registry=registry)
    assert cfg.sampling.seed is None and cfg.rollout.progress is None


def test_switching_a_component_by_set_drops_the_previous_ones_options_with_a_note(tmp_path, registry):
    path = write(tmp_path, "task: {name: math}\ncontroller: {name: majority_vote, samples: 5}\n"
                           "verifier: {name: exact_match, ignore_case: true, timeout: 7}\n")
    notes: list[str] = []
    cfg = load_config(path, ["controller.samples=2", "controller.name=best_of_n", "verifier.name=exact_match"],
                      registry=registry, note=notes.append)
    assert cfg.controller.name == "best_of_n" and cfg.controller.options == {"samples": 2}  # set by --set: kept
    assert cfg.verifier.options == {"ignore_case": True}  # the same name: nothing dropped
    assert notes == []
    cfg = load_config(path, ["controller.name=native"], registry=registry, note=notes.append)
    assert cfg.controller.name == "native" and cfg.controller.options == {}
    assert notes == ["--set controller.name=native: dropped controller.samples, the options of the previous "
                     "controller 'majority_vote'; set them again with --set if 'native' takes them"]
    notes.clear()
    write(tmp_path, "task: {name: math}\nverifier: {name: exact_match, ignore_case: true, timeout: 7}\n")
    other = plugin_set(math=Plugin(), other=_OtherVerifier()).registry
    cfg = load_config(path, ["verifier.name=other"], registry=other, note=notes.append)
    assert cfg.verifier.options == {} and cfg.verifier_timeout == 7  # the core's keys stay
    assert len(notes) == 1 and "verifier.ignore_case" in notes[0]


class _OtherVerifier:
    @hookimpl
    def register_verifiers(self, registry):
        from scaffold_core.builtins.verifiers import ExactMatchVerifier

        registry.add("other", lambda: ExactMatchVerifier())


def test_the_cli_prints_the_note_and_takes_unset(tmp_path, cli, fixture_site):
    path = write(tmp_path, "task: {name: hello}\ncontroller: {name: majority_vote, samples: 3}\n"
                           "sampling: {max_tokens: 20}\n")
    proc = cli("config", str(path), "--set", "controller.name=native", "--unset", "sampling.max_tokens",
               site=fixture_site, disable=ISOLATE)
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert data["controller"] == {"name": "native", "samples": 1}  # native's declared default, not the 3 dropped
    assert data["sampling"]["max_tokens"] == 64
    assert "note: --set controller.name=native: dropped controller.samples" in proc.stderr


def test_resolved_config_round_trips_through_yaml(tmp_path, registry):
    cfg = load_config(write(tmp_path, "task: {name: math, limit: 2}\n"), registry=registry)
    data = yaml.safe_load(cfg.to_yaml())
    assert data["task"] == {"name": "math", "limit": 2}
    assert data["sampling"]["max_tokens"] == 300
    again = load_config(data=data, registry=registry)
    assert again.to_dict() == cfg.to_dict()


def test_unknown_section_suggests_the_closest(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math}\nsampling_params: {max_tokens: 5}\n")
    assert "sampling_params: unknown section" in msg and "Did you mean 'sampling'?" in msg


def test_missing_task_lists_installed_tasks(tmp_path, registry):
    msg = error_of(tmp_path, registry, "sampling: {max_tokens: 5}\n")
    assert "task.name: required" in msg and "math" in msg


def test_unknown_component_name_lists_installed_and_suggests(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math}\ncontroller: {name: majority_votes}\n")
    assert "controller.name: unknown controller 'majority_votes'" in msg
    assert "best_of_n, majority_vote, native" in msg and "Did you mean 'majority_vote'?" in msg
    assert "pip install scaffold-" not in msg  # no package is guessed from a misspelt name
    assert "install that plugin's package" in msg


def test_a_component_no_installed_plugin_adds_points_at_the_plugin_list(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math}\nengine: {name: sglang}\n")
    assert "unknown engine 'sglang'" in msg and "docs/plugins.md lists which package adds which component" in msg
    assert "pip install --find-links dist PACKAGE" in msg and "make dist" in msg


def test_wrong_type_names_key_value_and_allowed(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math}\nsampling: {max_tokens: lots}\n")
    assert "sampling.max_tokens" in msg and "'lots'" in msg and "integer >= 1" in msg


@pytest.mark.parametrize("text,key,allowed", [
    ("sampling: {max_tokens: 0}", "sampling.max_tokens", "integer >= 1"),
    ("sampling: {top_p: 1.5}", "sampling.top_p", "(0, 1]"),
    ("sampling: {top_k: 0}", "sampling.top_k", "-1"),
    ("sampling: {temperature: -1}", "sampling.temperature", ">= 0"),
    ("rollout: {concurrency: 0}", "rollout.concurrency", "integer >= 1"),
    ("rollout: {launcher: slurm}", "rollout.launcher", "'local' or 'ray'"),
    ("verifier: {name: exact_match, timeout: -3}", "verifier.timeout", "seconds > 0"),
])
def test_out_of_range_values(tmp_path, registry, text, key, allowed):
    msg = error_of(tmp_path, registry, f"task: {{name: math}}\n{text}\n")
    assert key in msg and allowed in msg


def test_unknown_key_in_fixed_section_suggests(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math}\nsampling: {max_token: 10}\n")
    assert "sampling.max_token: unknown key" in msg and "Did you mean 'max_tokens'?" in msg


def test_component_options_are_validated_against_the_factory(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: {name: math, limt: 3}\n")
    assert "task.limt: unknown option for task 'math'" in msg and "Did you mean 'limit'?" in msg
    assert "limit, split" in msg
    msg = error_of(tmp_path, registry, "task: {name: math, limit: many}\n")
    assert "task.limit" in msg and "'many'" in msg and "int" in msg
    msg = error_of(tmp_path, registry, "task: {name: math}\ncontroller: {name: native, samples: 0}\n")
    assert "controller.samples: Input should be greater than or equal to 1; got 0" in msg and "int (>= 1) = 1" in msg


def test_section_must_be_a_mapping(tmp_path, registry):
    msg = error_of(tmp_path, registry, "task: math\n")
    assert "task: must be a mapping" in msg


def test_bad_files_and_overrides(tmp_path, registry):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml", registry=registry)
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: {name: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, registry=registry)
    listy = tmp_path / "list.yaml"
    listy.write_text("- task\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy, registry=registry)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(write(tmp_path, "task: {name: math}\n"), ["sampling.max_tokens"], registry=registry)


def test_yaml_is_loaded_safely(tmp_path, registry):
    evil = "task: !!python/object/apply:os.system ['echo pwned']\n"
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, evil), registry=registry)


def test_scaffold_config_prints_the_resolved_config(tmp_path, cli, fixture_site):
    path = write(tmp_path, "task: {name: hello}\n")
    proc = cli("config", str(path), "--set", "sampling.temperature=0", site=fixture_site, disable=ISOLATE)
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert data["sampling"]["temperature"] == 0 and data["sampling"]["max_tokens"] == 64
    assert data["verifier"]["name"] == "hello_exact" and data["engine"]["name"] == "transformers"
    assert set(data) == {"task", "controller", "engine", "sampling", "verifier", "trajectory", "rollout", "output"}
