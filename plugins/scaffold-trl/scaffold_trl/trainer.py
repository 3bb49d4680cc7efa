"""The ``trl`` trainer: GRPO with TRL's ``GRPOTrainer``, every rollout made by scaffold.

A scaffold config (task, controller, verifier, engine, sampling) becomes a
``GRPOTrainer(rollout_func=...)``. With the embedded ``transformers`` engine
the engine wraps the trainer's own model object, so each step's rollouts are
sampled from the current weights with nothing copied; with another engine
(SGLang on a GPU box) the policy is given by ``policy`` and its weights are
saved and loaded into the engine (``engine.update_weights``) before the
first rollout of each new step. Either way the trainer's step number is the
engine's weight version, recorded on every generated token.

Groups whose rewards are all equal are filtered and refilled
(``filter_groups``, ``rollout.py``); a step with none left takes no
optimizer step (``grpo.py``). Every step's rollouts go to the run's ledger,
checkpoints hold what ``--resume`` needs (``checkpoints.py``), metrics go to
the tracking sinks of ``report_to`` (``tracking.py``), and ``eval_every``
samples held-out prompts between steps.

TRL 1.16 is imported inside :meth:`TRLTrainer.train` only.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt

from scaffold_core.errors import ConfigError
from scaffold_core.plugins import Help
from scaffold_core.teacher import DistillMix
from scaffold_core.train.filtering import GroupFilter
from scaffold_core.trainer import Trainer, TrainJob

from . import checkpoints, tracking
from .grpo import callbacks, drop_skipped_figures, make_trainer
from .loop_thread import LoopThread
from .rollout import PromptIndex, RolloutBridge, scaffold

log = logging.getLogger("scaffold.trl")

#: Engine options that describe how the embedded engine loads its model (the trainer loads it instead).
LOAD_OPTIONS = ("model", "dtype", "device", "cache_converted", "trust_remote_code")
#: GRPOConfig fields this trainer sets from scaffold's config; ``grpo:`` may not override them.
DERIVED_FIELDS = ("output_dir", "num_generations", "max_completion_length", "temperature", "top_p", "top_k",
                  "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "use_vllm",
                  "logging_steps", "disable_tqdm", "remove_unused_columns")
#: GRPOConfig fields that are options of this trainer (set them as ``trainer.<option>``).
OPTION_FIELDS = {"learning_rate": "learning_rate", "beta": "beta", "loss_type": "loss_type",
                 "scale_rewards": "scale_rewards", "epsilon": "epsilon", "max_grad_norm": "max_grad_norm",
                 "weight_decay": "weight_decay", "warmup_steps": "warmup_steps", "save_steps": "save_steps",
                 "save_total_limit": "save_total_limit", "seed": "seed", "report_to": "report_to",
                 "full_determinism": "deterministic"}
Sink = Literal["tensorboard", "trackio", "wandb"]


def _check_grpo(grpo: dict[str, Any]) -> None:
    """``grpo:`` may set GRPOConfig fields scaffold does not set from its config or this trainer's options."""
    clash = sorted(set(grpo) & set(DERIVED_FIELDS))
    if clash:
        raise ValueError(f"grpo: {', '.join(clash)} come from scaffold's config (trainer and sampling "
                         "sections); set them there")
    options = sorted(set(grpo) & set(OPTION_FIELDS))
    if options:
        raise ValueError("grpo: " + ", ".join(options) + " are options of this trainer: set "
                         + ", ".join(f"trainer.{OPTION_FIELDS[k]}" for k in options) + " instead")


class TRLTrainer(Trainer):
    """``trainer: {name: trl, ...}``: GRPO on scaffold's rollouts with TRL (see the plugin README)."""

    def __init__(self, max_steps: Annotated[int, Ge(1), Help("optimizer steps")] = 20,
                 learning_rate: Annotated[float, Gt(0), Help("AdamW learning rate")] = 1e-5,
                 num_generations: Annotated[int, Ge(2), Help("samples per prompt (the GRPO group compares them)")] = 4,
                 prompts_per_step: Annotated[int, Ge(1), Help("distinct prompts per optimizer step")] = 4,
                 micro_batch_size: Annotated[int, Ge(1), Help("sequences per forward/backward pass (divides "
                                                              "prompts_per_step * num_generations)")] | None = None,
                 beta: Annotated[float, Ge(0), Help("KL coefficient; > 0 loads a reference model")] = 0.0,
                 loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dapo",
                 scale_rewards: Literal["group", "batch", "none"] = "group", epsilon: float = 0.2,
                 max_grad_norm: float = 1.0, weight_decay: float = 0.0, warmup_steps: int = 0,
                 save_steps: Annotated[int, Ge(1), Help("checkpoint every N steps (null: at the end)")] | None = None,
                 save_total_limit: Annotated[int, Ge(1), Help("keep the last N checkpoints (null: all)")] | None = 1,
                 seed: int = 0, threads: Annotated[int, Ge(1), Help("torch CPU threads")] | None = None,
                 policy: str | None = None,
                 rollout_timeout: Annotated[float, Gt(0), Help("seconds one step's rollouts may take")] = 3600.0,
                 filter_groups: Literal["none", "zero_variance"] | None = None, max_refill_rounds: int = 2,
                 report_to: list[Sink] | None = None, deterministic: bool = False,
                 eval_every: Annotated[int, Ge(1), Help("evaluate held-out rows every N steps")] | None = None,
                 eval_task: dict[str, Any] | None = None,
                 eval_samples: Annotated[int, Ge(1), Help("samples per held-out prompt")] = 4,
                 grpo: dict[str, Any] | None = None, algorithm: Literal["grpo", "opd"] = "grpo",
                 teacher: dict[str, Any] | None = None, opd_kl_weight: float = 1.0, opd_reward_weight: float = 0.0,
                 opd_clip: Annotated[float, Gt(0)] | None = None,
                 opd_top_k_weight: Annotated[float, Ge(0), Help("weight of the loss over the teacher's top-k "
                                                                "(needs teacher.top_k)")] = 0.0):
        batch = prompts_per_step * num_generations
        if micro_batch_size is not None and batch % micro_batch_size:
            raise ValueError(f"micro_batch_size must divide prompts_per_step * num_generations ({batch}), "
                             f"got {micro_batch_size}")
        _check_grpo(grpo or {})
        if eval_every is not None and eval_task is None:
            raise ValueError("eval_every needs eval_task: the training task's options for the held-out rows, "
                             "e.g. eval_task: {split: test}")
        self.max_steps = max_steps
        self.learning_rate = learning_rate
        self.num_generations = num_generations
        self.prompts_per_step = prompts_per_step
        self.micro_batch_size = micro_batch_size or batch
        self.beta = beta
        self.loss_type = loss_type
        self.scale_rewards = scale_rewards
        self.epsilon = epsilon
        self.max_grad_norm = max_grad_norm
        self.weight_decay = weight_decay
        self.warmup_steps = warmup_steps
        self.save_steps = save_steps or max_steps
        self.save_total_limit = save_total_limit
        self.seed = seed
        self.threads = threads
        self.policy = policy
        self.rollout_timeout = rollout_timeout
        if algorithm == "opd" and not teacher:
            raise ValueError("algorithm: opd needs teacher: the teacher model's options, e.g. "
                             "teacher: {model: runs/teacher/final}")
        if algorithm == "opd" and filter_groups == "zero_variance":
            raise ValueError("filter_groups: zero_variance drops groups whose rewards are equal, but on-policy "
                             "distillation learns from every sample (the teacher scores each token); use none")
        if opd_top_k_weight > 0 and (algorithm != "opd" or not int((teacher or {}).get("top_k") or 0)):
            raise ValueError("opd_top_k_weight needs algorithm: opd and a teacher that returns its top-k "
                             "alternatives: teacher: {top_k: 8, ...}")
        self.opd_top_k_weight = opd_top_k_weight
        self.algorithm = algorithm
        self.teacher = dict(teacher or {})
        self.mix = DistillMix(opd_kl_weight, opd_reward_weight, opd_clip)
        # GRPO filters groups whose rewards are all equal by default; distillation learns from every group.
        filter_groups = filter_groups or ("none" if algorithm == "opd" else "zero_variance")
        self.group_filter = GroupFilter(filter_groups, max_refill_rounds)
        self.report_to = tracking.check_sinks(list(report_to or []))
        self.deterministic = deterministic
        self.eval_every = eval_every
        self.eval_task = dict(eval_task or {})
        self.eval_samples = eval_samples
        self.grpo = dict(grpo or {})

    def train(self, job: TrainJob) -> dict[str, Any]:
        with GRPORun(self, job) as run:
            return run.train()


class GRPORun:
    """One training run, opened step by step (the trainer's ``train`` uses it; so do tests and benchmarks).

    ``open()`` loads the policy, builds the engine and :class:`TrainingRollouts`
    on a background event loop and the ``GRPOTrainer``; ``train()`` trains;
    ``close()`` releases all of it (also after errors). ``run(coro)`` runs a
    coroutine on the rollouts' event loop (e.g. ``run.engine.generate(...)``).
    """

    def __init__(self, options: TRLTrainer, job: TrainJob):
        self.options = options
        self.job = job
        self.config = job.config
        self.loop: LoopThread | None = None
        self.rollouts: Any = None
        self.engine: Any = None
        self.model: Any = None
        self.tokenizer: Any = None
        self.trainer: Any = None
        self.bridge: RolloutBridge | None = None
        self.wraps_model = False
        self.steps_skipped = 0
        self.eval_rows: list[dict[str, Any]] = []
        self.eval_source: Any = None
        self.pending_eval: dict[str, Any] = {}
        self.resumed_from: str | None = None
        self.teacher: Any = None
        self.distill_figures: dict[str, float] = {}

    def __enter__(self) -> GRPORun:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- setup --------------------------------------------------------------------
    def _check_sampling(self) -> None:
        s = self.config.sampling
        if s.temperature <= 0:
            raise ConfigError("sampling.temperature: GRPO samples, so it must be > 0 (TRL's loss divides the "
                              f"logits by it); got {s.temperature}")
        if s.top_p != 1.0 or s.top_k != -1:
            raise ConfigError("sampling.top_p/top_k: TRL's loss scores tokens under the temperature-scaled "
                              "distribution with no truncation, so sample with top_p: 1.0 and top_k: -1 "
                              f"(got top_p {s.top_p}, top_k {s.top_k})")

    def open(self) -> None:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
        self._check_sampling()
        from scaffold_core.train.prompt_groups import TrainingRollouts

        if self.options.threads:
            import torch

            torch.set_num_threads(self.options.threads)
        self._load_policy()
        self.loop = LoopThread()
        if self.options.algorithm == "opd":
            self._open_teacher()
        from scaffold_core.distributed.ports import rank_slice
        from scaffold_core.engine import RunInfo

        self.rollouts = TrainingRollouts.from_config(
            self.config, engine=self.engine, registry=self.job.registry,
            run_info=RunInfo(output_dir=Path(self.job.output_dir), port_range=rank_slice(0, 1)))
        self.loop.run(self.rollouts.start(), 3600.0)
        index = PromptIndex(self.rollouts)
        if not index.rows:
            raise ConfigError(f"task {self.config.task.name!r}: no usable rows to train on "
                              f"({len(index.unusable)} could not be rendered)")
        if len(index.rows) < self.options.prompts_per_step:
            raise ConfigError(f"trainer.prompts_per_step: {self.options.prompts_per_step} distinct rows are drawn "
                              f"for each step, but task {self.config.task.name!r} has {len(index.rows)} usable "
                              f"row(s) ({len(index.unusable)} could not be rendered), so no step could run; lower "
                              "prompts_per_step or give the task more rows (limit, a larger split)")
        self.index = index
        if self.options.eval_every:
            from .evaluation import eval_task

            self.eval_source = eval_task(self.config, self.job.registry, self.options.eval_task)
            self.eval_rows = list(self.eval_source.load())
            if not self.eval_rows:
                raise ConfigError(f"trainer.eval_task: {self.options.eval_task} gives no rows to evaluate on")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.bridge = RolloutBridge(self.rollouts, index, self.loop, timeout=self.options.rollout_timeout,
                                    sync=None if self.wraps_model else self._save_for_engine,
                                    group_filter=self.options.group_filter, seed=self.config.sampling.seed,
                                    ledger=self.job.ledger, pad_id=int(pad or 0))
        tracking.prepare_environment(self.options.report_to, Path(self.job.output_dir))
        self.trainer = self._grpo_trainer(index.prompts)
        tracking.place_tensorboard(self.trainer, Path(self.job.output_dir))

    def _load_policy(self) -> None:
        from scaffold_core.engines.model_loading import load_model_and_tokenizer, resolve_model
        from scaffold_transformers import TransformersEngine

        engine_cfg = self.config.engine
        self.wraps_model = engine_cfg.name == "transformers"
        options = dict(engine_cfg.options)
        model_name = self.options.policy or (options.get("model") if self.wraps_model else None)
        if not self.wraps_model and self.options.policy is None:
            raise ConfigError(f"trainer.policy: required with engine {engine_cfg.name!r} (the model to train, "
                              "a local folder or hub id; its weights are synced to the engine every step)")
        device = options.get("device", "auto")
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.model, self.tokenizer, _ = load_model_and_tokenizer(
            resolve_model(model_name), dtype=options.get("dtype", "float32"), device=device,
            use_cache=options.get("cache_converted", True), trust_remote_code=options.get("trust_remote_code", False))
        _make_trainable(self.model)
        if self.wraps_model:
            wrap_options = {k: v for k, v in options.items() if k not in LOAD_OPTIONS}
            if wrap_options.get("pack_weights") is None:  # every optimizer step reaches the engine as an update
                wrap_options["pack_weights"] = True  # (sync_weights), which drops the packed copies of old weights
            self.engine = TransformersEngine.wrap(self.model, self.tokenizer, **wrap_options)
        else:
            self.engine = self.job.registry.create("engine", engine_cfg.name, engine_cfg.options, path="engine")

    def _open_teacher(self) -> None:
        from scaffold_core.teacher import check_same_tokenizer, make_teacher

        s = self.config.sampling
        if s.temperature != 1.0:
            raise ConfigError("sampling.temperature: on-policy distillation compares the student's sampling "
                              "distribution with the teacher's at temperature 1, so sample with temperature: 1.0 "
                              f"(got {s.temperature})")
        assert self.loop is not None
        # the student is the policy itself, weights as loaded (its engine wraps it): so is a teacher loaded here
        self.teacher = make_teacher(self.options.teacher, device=self.device, float16_weights=False)
        self.loop.run(self.teacher.start(), 3600.0)
        check_same_tokenizer(self.tokenizer, self.teacher.tokenizer)

    def _save_for_engine(self, trainer: Any) -> str:
        """Save the current weights where a separate engine can load them (``update_weights``)."""
        target = Path(self.job.output_dir) / "weights-sync"
        trainer.model.save_pretrained(str(target), safe_serialization=True)
        self.tokenizer.save_pretrained(str(target))
        return str(target)

    def _grpo_config(self) -> Any:
        from trl import GRPOConfig

        o = self.options
        batch = o.prompts_per_step * o.num_generations
        fields: dict[str, Any] = dict(
            use_cpu=self.device == "cpu", bf16=False, fp16=False, activation_checkpointing=False,
            save_strategy="steps", save_only_model=False, disable_dropout=True, project="scaffold",
            run_name=Path(self.job.output_dir).name or "scaffold")
        fields.update(o.grpo)  # what grpo: may set
        fields.update(  # what comes from scaffold's config and the trainer's options
            output_dir=str(self.job.output_dir), use_vllm=False, beta=o.beta, num_generations=o.num_generations,
            per_device_train_batch_size=o.micro_batch_size, gradient_accumulation_steps=batch // o.micro_batch_size,
            max_completion_length=self.config.sampling.max_tokens, temperature=self.config.sampling.temperature,
            top_p=1.0, top_k=0, learning_rate=o.learning_rate, max_steps=o.max_steps, logging_steps=1,
            save_steps=o.save_steps, save_total_limit=o.save_total_limit, report_to=o.report_to or "none",
            full_determinism=o.deterministic, seed=o.seed, disable_tqdm=True, loss_type=o.loss_type,
            scale_rewards=o.scale_rewards, epsilon=o.epsilon, max_grad_norm=o.max_grad_norm,
            weight_decay=o.weight_decay, warmup_steps=o.warmup_steps, remove_unused_columns=False)
        return GRPOConfig(**fields)

    def _grpo_trainer(self, prompts: list[str]) -> Any:
        import datasets
        from transformers import PrinterCallback

        trainer = make_trainer(self, model=self.model, reward_funcs=scaffold, args=self._grpo_config(),
                               processing_class=self.tokenizer,
                               train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                               rollout_func=self.bridge, callbacks=[callbacks(self)])
        trainer.remove_callback(PrinterCallback)  # scaffold prints each step itself
        return trainer

    # -- what each step adds ---------------------------------------------------------
    def step_log(self, logs: dict[str, Any], series: dict[str, list[float]]) -> None:
        """Merge scaffold's metrics of the step into the Trainer's log (``series``: TRL's metrics of the step)."""
        assert self.bridge is not None
        record = self.bridge.latest
        if record is None:
            return
        stats = self.rollouts.stats
        if record.skipped:
            drop_skipped_figures(logs, series)
        logs.update({**record.metrics, **self.distill_figures, "version": record.version,
                     "stale_dropped": stats.stale_dropped,
                     "stale_regenerated": stats.stale_regenerated, "skipped": int(record.skipped),
                     "steps_skipped": self.steps_skipped, **self.pending_eval})
        self.pending_eval = {}

    def maybe_evaluate(self, step: int) -> None:
        """Sample the held-out rows on the current weights when ``step`` is a multiple of ``eval_every``."""
        every = self.options.eval_every
        if not every or step % every or self.eval_source is None:
            return
        from .evaluation import evaluate

        started = time.perf_counter()
        figures = self.run(evaluate(self.rollouts, self.eval_source, self.eval_rows,
                                    samples=self.options.eval_samples, step=step), self.options.rollout_timeout)
        self.pending_eval = {k: v for k, v in figures.items() if v is not None}
        self.pending_eval["eval_time_s"] = round(time.perf_counter() - started, 3)

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        """What ``scaffold_state.json`` of the checkpoint at ``step`` holds."""
        return {"step": step, "job": self.job.checkpoint_state(),
                "trainer": {"steps_skipped": self.steps_skipped, "rollouts": self.rollouts.stats.to_dict()}}

    def _start_point(self) -> str | None:
        """The checkpoint to resume from (its metrics and ledger rewound to it), or None for a fresh start."""
        output_dir = Path(self.job.output_dir)
        if not self.job.resume:
            removed = checkpoints.remove_all(output_dir)
            if removed:
                log.info("removed the checkpoints of an earlier run in %s: %s", output_dir, ", ".join(removed))
            return None
        found = checkpoints.last_complete(output_dir)
        if found is None:
            self.job.rewind(0, None)
            return None
        folder, state = found
        self.job.rewind(int(state["step"]), state.get("job"))
        counters = state.get("trainer") or {}
        self.steps_skipped = int(counters.get("steps_skipped", 0))
        for key, value in (counters.get("rollouts") or {}).items():
            if hasattr(self.rollouts.stats, key):
                setattr(self.rollouts.stats, key, int(value))
        return str(folder)

    # -- running -------------------------------------------------------------------
    def run(self, coro: Any, timeout: float = 600.0) -> Any:
        """Run a coroutine on the rollouts' event loop (e.g. a probe request to ``self.engine``)."""
        assert self.loop is not None, "open() first"
        return self.loop.run(coro, timeout)

    def train(self) -> dict[str, Any]:
        assert self.trainer is not None and self.bridge is not None, "open() first"
        from transformers.utils import logging as hf_logging

        started = time.perf_counter()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # checkpoint writes draw bars of their own between scaffold's step lines
        with warnings.catch_warnings():
            # TRL 1.16 reads a property transformers 5 deprecated; nothing for a user to do about it
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            try:
                self.resumed_from = self._start_point()
                result = self.trainer.train(resume_from_checkpoint=self.resumed_from)
                final = Path(self.job.output_dir) / "final"
                self.trainer.save_model(str(final))
                tracking.finish(self.options.report_to)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
        history = self.bridge.history
        steps = int(self.trainer.state.global_step)
        return {
            "trainer": "trl", "steps": steps, "optimizer_steps": steps - self.steps_skipped,
            "train_loss": float(result.training_loss) if math.isfinite(result.training_loss) else None,
            "reward_by_step": [round(r.metrics["reward_mean"], 4) for r in history],
            "final_model": str(final), "checkpoints": sorted(p.name for p in Path(self.job.output_dir).glob(
                "checkpoint-*")), "weight_version": self.engine.weight_version,
            "rollouts": self.rollouts.stats.to_dict(), "train_s": round(time.perf_counter() - started, 2),
            "same_text_prompts": self.index.same_text, "unusable_rows": len(self.index.unusable),
            "steps_skipped": self.steps_skipped, "resumed_from": self.resumed_from, "algorithm": self.options.algorithm,
            **({"teacher": self.teacher.stats.to_dict()} if self.teacher is not None else {}),
        }

    def close(self) -> None:
        try:
            if self.loop is not None and self.rollouts is not None:
                self.loop.run(self.rollouts.close(), 600.0)
        finally:
            if self.loop is not None:
                if self.teacher is not None:
                    self.loop.run(self.teacher.close(), 600.0)
                self.loop.stop()
            self.rollouts = None
            self.loop = None


def _make_trainable(model: Any) -> None:
    """A model loaded from a GGUF file is flagged as quantized, which the Trainer refuses to fine-tune;
    its weights are plain dequantized tensors, so the flag goes."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
