"""The ``skyrl_gym`` task: rows in SkyRL's dataset format, each naming the skyrl-gym environment that scores it.

A SkyRL dataset row holds ``prompt`` (chat messages), ``env_class`` (the environment id) and whatever
the environment reads from its ``extras``: ``reward_spec`` (``{"method": "rule", "ground_truth": ...}``),
``reward_model`` (aime), ``extra_info``, ``db_id`` and ``data`` (text2sql), ... Every column but ``prompt``
and ``env_class`` goes to the environment as ``extras``, as SkyRL's generator passes them. Files are read
(streamed) by the built-in ``dataset`` task's machinery: JSON lines, parquet or CSV, or a hub dataset.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Literal

from scaffold_core.errors import DataError
from scaffold_datasets import DatasetTask, json_value

from .envs import CODE_EXECUTING


class SkyRLGymTask(DatasetTask):
    """Rows for skyrl-gym environments (see the module docstring).

    Options:

    * ``data_files``: the dataset file(s) (``.jsonl``, ``.parquet``, ``.csv``), or ``{split: file(s)}``;
      ``path``: a builder or a hub id instead (default: taken from the files' suffix).
    * ``env``: the environment of rows without ``env_class`` (and the one every row must name, if set
      with ``only_env: true``).
    * ``env_args``: the environment's config (SkyRL's ``skyrl_gym_cfg.<env>``: ``db_path``, ``search_url``,
      ...), the same for every row.
    * ``code_execution`` (``jail``): environments that run the model's code (``lcb``, ``searchcode``) do it
      inside skyrl-gym's own process, which scaffold cannot put in its jail, so with ``jail`` (the default,
      as everywhere in scaffold) they are refused; ``host`` runs them on this machine, after a loud warning.
    * ``split``, ``limit``, ``shuffle``, ``seed``, ``id`` (a column naming rows), ``cache_dir``: as the
      ``dataset`` task's.
    """

    default_config: ClassVar[dict[str, Any]] = {
        "controller": {"name": "gym_env"},
        "trajectory": {"name": "multiturn"},
        "sampling": {"max_tokens": 512},
        "verifier": {"name": "exact_match"},  # gym_env's rewards are the environment's: no verifier runs there
    }

    def __init__(self, data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 path: str | None = None, env: str | None = None, env_args: dict[str, Any] | None = None,
                 code_execution: Literal["jail", "host"] = "jail", split: str = "train", id: str | None = None,
                 limit: int | None = None, shuffle: bool = False, seed: int = 0, cache_dir: str | None = None,
                 allow_code_execution: Any = None):
        if allow_code_execution is not None:
            raise ValueError("allow_code_execution is now code_execution: host (runs the model's code on this "
                             "machine, loudly; the default, jail, refuses environments that run it unjailed)")
        if code_execution not in ("jail", "host"):
            raise ValueError(f"code_execution must be jail (the default) or host (this machine, unisolated), got "
                             f"{code_execution!r}")
        if data_files is None and path is None:
            raise ValueError("the skyrl_gym task reads a dataset: set task.data_files (SkyRL's format: prompt, "
                             "env_class, reward_spec, ...) or task.path")
        builder = path or _builder_of(data_files)
        super().__init__(path=builder, data_files=data_files, split=split, messages="prompt", id=id, limit=limit,
                         shuffle=shuffle, seed=seed, cache_dir=cache_dir)
        self.env = env
        self.env_args = dict(env_args or {})
        self.code_execution = code_execution
        self._warned = False

    def make_row(self, record: dict[str, Any], index: int, seen: set[str]) -> dict[str, Any] | None:
        row = super().make_row(record, index, seen)
        if row is None:
            return None
        env_id = record.get("env_class") or self.env
        if not env_id:
            raise DataError(f"task: row {index} of {self.where} names no environment (env_class) and task.env is "
                            "not set; set task.env to a skyrl-gym environment id (gsm8k, aime, text2sql, ...)")
        env_id = str(env_id)
        if env_id in CODE_EXECUTING:
            if self.code_execution != "host":
                raise DataError(f"task: environment {env_id!r} (row {index} of {self.where}) runs the model's code "
                                "inside skyrl-gym's own process, which scaffold cannot put in its jail; set "
                                "task.code_execution: host to run it on this machine anyway (unisolated)")
            self._warn_host(env_id)
        extras = {k: json_value(v) for k, v in record.items() if k not in ("prompt", "env_class")}
        for key, other in (("reward_spec", "reward_model"), ("reward_model", "reward_spec")):
            if isinstance(extras.get(key), dict) and other not in extras:
                extras[other] = extras[key]  # aime reads reward_model, the others reward_spec: either column works
        return {**row, "env_class": env_id, "extras": extras, "env_config": self.env_args}

    def _warn_host(self, env_id: str) -> None:
        if self._warned:
            return
        self._warned = True
        bar = "!" * 78
        print(f"\n{bar}\nWARNING: task.code_execution: host. skyrl-gym environment {env_id!r} runs the model's code on "
              "this machine, as this user, with nothing between it and your files, keys and network. Use it only "
              f"for code you trust.\n{bar}", file=sys.stderr)

    def reference(self, row: dict[str, Any]) -> Any:
        """The ground truth the environment compares with (for the record; the environment scores)."""
        extras = row.get("extras") or {}
        for key in ("reward_spec", "reward_model"):
            spec = extras.get(key)
            if isinstance(spec, dict) and "ground_truth" in spec:
                return json_value(spec["ground_truth"])
        return None


def _builder_of(data_files: Any) -> str:
    """The ``datasets`` builder of the files' suffix (``json`` for ``.jsonl``)."""
    first = data_files
    while isinstance(first, (dict, list, tuple)):
        first = next(iter(first.values() if isinstance(first, dict) else first), "")
    text = str(first).lower()
    for suffix, builder in ((".parquet", "parquet"), (".csv", "csv"), (".jsonl", "json"), (".json", "json")):
        if text.endswith(suffix):
            return builder
    raise ValueError(f"task.data_files: cannot tell the format of {first!r} from its suffix; set task.path to "
                     "json, parquet or csv")
