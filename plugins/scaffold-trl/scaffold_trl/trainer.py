"""The ``trl`` trainer: GRPO with TRL's ``GRPOTrainer``, every rollout made by scaffold.

A scaffold config (task, controller, verifier, engine, sampling) becomes a
``GRPOTrainer(rollout_func=...)``. With the embedded ``transformers`` engine
the engine wraps the trainer's own model object, so each step's rollouts are
sampled from the current weights with nothing copied; with another engine
(SGLang on a GPU box) the policy is given by ``policy`` and its weights are
saved and loaded into the engine (``engine.update_weights``) before the
first rollout of each new step. Either way the trainer's step number is the
engine's weight version, recorded on every generated token.

TRL 1.16 is imported inside :meth:`TRLTrainer.train` only.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Literal

from scaffold_core.errors import ConfigError
from scaffold_core.trainer import Trainer, TrainJob, TrainStep

from .loop_thread import LoopThread
from .rollout import PromptIndex, RolloutBridge, scaffold

#: Engine options that describe how the embedded engine loads its model (the trainer loads it instead).
LOAD_OPTIONS = ("model", "dtype", "device", "cache_converted", "trust_remote_code")
#: GRPOConfig fields this trainer sets from scaffold's config; ``grpo:`` may not override them.
DERIVED_FIELDS = ("output_dir", "num_generations", "max_completion_length", "temperature", "top_p", "top_k",
                  "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "use_vllm",
                  "logging_steps", "disable_tqdm", "remove_unused_columns")


class TRLTrainer(Trainer):
    """``trainer: {name: trl, ...}``: GRPO on scaffold's rollouts with TRL (see the plugin README)."""

    def __init__(self, max_steps: int = 20, learning_rate: float = 1e-5, num_generations: int = 4,
                 prompts_per_step: int = 4, micro_batch_size: int | None = None, beta: float = 0.0,
                 loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dapo",
                 scale_rewards: Literal["group", "batch", "none"] = "group", epsilon: float = 0.2,
                 max_grad_norm: float = 1.0, weight_decay: float = 0.0, warmup_steps: int = 0,
                 save_steps: int | None = None, seed: int = 0, threads: int | None = None,
                 policy: str | None = None, rollout_timeout: float = 3600.0,
                 grpo: dict[str, Any] | None = None):
        for name, value in (("max_steps", max_steps), ("prompts_per_step", prompts_per_step)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (GRPO compares samples of one prompt), got "
                             f"{num_generations}")
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        batch = prompts_per_step * num_generations
        if micro_batch_size is not None and (micro_batch_size < 1 or batch % micro_batch_size):
            raise ValueError(f"micro_batch_size must divide prompts_per_step * num_generations ({batch}), "
                             f"got {micro_batch_size}")
        if save_steps is not None and save_steps < 1:
            raise ValueError(f"save_steps must be >= 1 or null, got {save_steps}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 or null, got {threads}")
        if rollout_timeout <= 0:
            raise ValueError(f"rollout_timeout must be > 0 seconds, got {rollout_timeout}")
        clash = sorted(set(grpo or {}) & set(DERIVED_FIELDS))
        if clash:
            raise ValueError(f"grpo: {', '.join(clash)} come from scaffold's config (trainer and sampling "
                             "sections); set them there")
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
        self.seed = seed
        self.threads = threads
        self.policy = policy
        self.rollout_timeout = rollout_timeout
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
        self.index = index
        self.bridge = RolloutBridge(self.rollouts, index, self.loop, timeout=self.options.rollout_timeout,
                                    sync=None if self.wraps_model else self._save_for_engine)
        self.trainer = self._grpo_trainer(index.prompts)

    def _load_policy(self) -> None:
        from scaffold_core.engines.model_loading import load_model_and_tokenizer, resolve_model
        from scaffold_core.engines.transformers_engine import TransformersEngine

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
            self.engine = TransformersEngine.wrap(self.model, self.tokenizer,
                                                  **{k: v for k, v in options.items() if k not in LOAD_OPTIONS})
        else:
            self.engine = self.job.registry.create("engine", engine_cfg.name, engine_cfg.options, path="engine")

    def _save_for_engine(self, trainer: Any) -> str:
        """Save the current weights where a separate engine can load them (``update_weights``)."""
        target = Path(self.job.output_dir) / "weights-sync"
        trainer.model.save_pretrained(str(target), safe_serialization=True)
        self.tokenizer.save_pretrained(str(target))
        return str(target)

    def _grpo_trainer(self, prompts: list[str]) -> Any:
        import datasets
        from transformers import PrinterCallback
        from trl import GRPOConfig, GRPOTrainer

        o = self.options
        batch = o.prompts_per_step * o.num_generations
        args = GRPOConfig(
            output_dir=str(self.job.output_dir), use_cpu=self.device == "cpu", bf16=False, fp16=False,
            activation_checkpointing=False, use_vllm=False, beta=o.beta, num_generations=o.num_generations,
            per_device_train_batch_size=o.micro_batch_size, gradient_accumulation_steps=batch // o.micro_batch_size,
            max_completion_length=self.config.sampling.max_tokens, temperature=self.config.sampling.temperature,
            top_p=1.0, top_k=0, learning_rate=o.learning_rate, max_steps=o.max_steps, logging_steps=1,
            save_strategy="steps", save_steps=o.save_steps, save_only_model=True, report_to="none",
            disable_dropout=True, seed=o.seed, disable_tqdm=True, loss_type=o.loss_type,
            scale_rewards=o.scale_rewards, epsilon=o.epsilon, max_grad_norm=o.max_grad_norm,
            weight_decay=o.weight_decay, warmup_steps=o.warmup_steps, remove_unused_columns=False, **o.grpo)
        trainer = GRPOTrainer(model=self.model, reward_funcs=scaffold, args=args, processing_class=self.tokenizer,
                              train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                              rollout_func=self.bridge, callbacks=[_reporter(self)])
        trainer.remove_callback(PrinterCallback)  # scaffold prints each step itself
        return trainer

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
                result = self.trainer.train()
                final = Path(self.job.output_dir) / "final"
                self.trainer.save_model(str(final))
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
        history = self.bridge.history
        return {
            "trainer": "trl", "steps": int(self.trainer.state.global_step),
            "train_loss": float(result.training_loss) if math.isfinite(result.training_loss) else None,
            "reward_by_step": [round(r.metrics["reward_mean"], 4) for r in history],
            "final_model": str(final), "checkpoints": sorted(p.name for p in Path(self.job.output_dir).glob(
                "checkpoint-*")), "weight_version": self.engine.weight_version,
            "rollouts": self.rollouts.stats.to_dict(), "train_s": round(time.perf_counter() - started, 2),
            "duplicate_prompts": self.index.duplicates, "unusable_rows": len(self.index.unusable),
        }

    def close(self) -> None:
        try:
            if self.loop is not None and self.rollouts is not None:
                self.loop.run(self.rollouts.close(), 600.0)
        finally:
            if self.loop is not None:
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


def _reporter(run: GRPORun) -> Any:
    """A TrainerCallback turning each step's log into a scaffold TrainStep."""
    from transformers import TrainerCallback

    class ScaffoldSteps(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if run.bridge is not None and run.trainer is not None:
                run.bridge.sync_weights(run.trainer)  # the engine serves the new weights from here on

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if not logs or "loss" not in logs or run.bridge is None or not run.bridge.history:
                return  # the end-of-training summary log, or nothing rolled out yet
            record = run.bridge.history[-1]
            stats = run.rollouts.stats
            metrics = {"reward_mean": record.metrics["reward_mean"], "loss": float(logs["loss"]),
                       "version": record.version, "stale_dropped": stats.stale_dropped,
                       "stale_regenerated": stats.stale_regenerated, "reward_std": logs.get("reward_std"),
                       "rollout_s": record.metrics["rollout_s"], "step_time_s": logs.get("step_time"),
                       "completions": record.metrics["completions"], "grad_norm": logs.get("grad_norm"),
                       "entropy": logs.get("entropy"), "learning_rate": logs.get("learning_rate")}
            checkpoint = f"checkpoint-{state.global_step}" if control.should_save else None
            run.job.report(TrainStep(int(state.global_step), int(state.max_steps) or None,
                                     {k: v for k, v in metrics.items() if v is not None}, checkpoint))

    return ScaffoldSteps()
