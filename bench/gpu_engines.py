"""On a machine with one GPU: install vLLM and SGLang, serve a small model with each, run the server engines'
protocol checks against the real servers, and a 2-step ``scaffold train`` that pushes its weights to them.

For each engine (``--engines vllm,sglang``), in order:

1. **Install** (skipped with ``--no-install``): a virtual environment of its own
   (``<work>/venv-<engine>``: vLLM and SGLang pin different torch builds), the
   server (``pip install vllm`` / ``pip install "sglang[all]"``), then
   scaffold (the core and the engine, gsm8k and trl plugins, editable from this
   checkout) constrained to the torch the server brought.
2. **Checkpoint**: the model saved with ``save_pretrained`` (safetensors) under
   ``<work>/checkpoint``: the directory the weight-update checks load.
3. **Serve and check**: one server started as a user would (``vllm serve`` with
   ``VLLM_SERVER_DEV_MODE=1`` and scaffold's worker extension;
   ``python -m sglang.launch_server``), then pytest on the plugin's live checks
   (its ``RemoteEngineConformance`` class and its ``test_*live*.py`` file) with
   ``SCAFFOLD_<ENGINE>_URL`` and ``SCAFFOLD_<ENGINE>_CHECKPOINT`` set; the
   server is stopped.
4. **Train**: ``scaffold train`` for 2 steps (TRL's GRPO on the GPU, GSM8K
   sample problems) with ``engine: {name: <engine>, launch: ...}``: scaffold
   starts the server itself and loads the policy into it after each optimizer
   step. Checked: 2 lines in ``train_metrics.jsonl`` and at least one weight
   update in the engine's stats.

Every process this script starts runs in its own process group and is stopped
on the way out (also on Ctrl-C). What it measured (server start-up time,
checks passed/failed/skipped, the train's wall time and rewards) is printed as
one JSON object and written to ``<work>/gpu_engines.json``; every log is kept
under ``<work>``.

``--fake`` runs the same sequence in this environment against the plugins'
protocol test servers (no GPU, no install; a tiny random policy with
SmolLM2's tokenizer): it checks this script's own logic, and the live checks'.

Run: ``python bench/gpu_engines.py --model Qwen/Qwen2.5-0.5B-Instruct`` (needs
network access to PyPI and the model hub, or a local ``--model`` directory);
``--dry-run`` prints the commands without running them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ENGINES: dict[str, dict[str, Any]] = {
    "vllm": {
        "server": ["vllm>=0.11"],
        "plugin": "plugins/scaffold-vllm",
        "health": "/health",
        "env": {"VLLM_SERVER_DEV_MODE": "1"},
        "command": ["-m", "vllm.entrypoints.cli.main", "serve"],
        "fake": [str(ROOT / "plugins/scaffold-vllm/tests/vllm_test_server.py"), "serve"],
        "model_flag": None,  # the model is vllm serve's first argument
        "serve_args": ["--gpu-memory-utilization", "0.45", "--max-model-len", "4096",
                       "--worker-extension-cls", "scaffold_vllm.worker_extension.WeightLoader"],
        "launch_args": ["--gpu-memory-utilization", "0.35", "--max-model-len", "2048", "--enforce-eager"],
        "checks": ["plugins/scaffold-vllm/tests/test_vllm_conformance.py::TestLiveVLLMEngineConformance",
                   "plugins/scaffold-vllm/tests/test_vllm_live.py"],
        "variable": "VLLM",
    },
    "sglang": {
        "server": ["sglang[all]>=0.5"],
        "plugin": "plugins/scaffold-sglang",
        "health": "/health_generate",
        "env": {},
        "command": ["-m", "sglang.launch_server"],
        "fake": [str(ROOT / "plugins/scaffold-sglang/tests/sglang_test_server.py")],
        "model_flag": "--model-path",
        "serve_args": ["--mem-fraction-static", "0.45", "--context-length", "4096"],
        "launch_args": ["--mem-fraction-static", "0.35", "--context-length", "2048"],
        "checks": ["plugins/scaffold-sglang/tests/test_conformance.py::TestLiveSGLangEngineConformance",
                   "plugins/scaffold-sglang/tests/test_live_sglang.py"],
        "variable": "SGLANG",
    },
}
#: What scaffold needs beside the server, installed editable from this checkout.
SCAFFOLD = [".", "plugins/scaffold-gsm8k", "plugins/scaffold-trl"]
STARTED: list[subprocess.Popen] = []


class Step:
    """Runs (or, with --dry-run, prints) commands; logs go to files under the work directory."""

    def __init__(self, work: Path, dry_run: bool):
        self.work = work
        self.dry_run = dry_run

    def run(self, argv: list[str], log: str, *, env: dict[str, str] | None = None, timeout: float = 3600,
            cwd: Path = ROOT) -> int:
        print(f"$ {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {shlex.join(argv)}  > {log}", flush=True)
        if self.dry_run:
            return 0
        with open(self.work / log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                    env={**os.environ, **(env or {})})
            STARTED.append(proc)
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"  timed out after {timeout:g} s", flush=True)
                return 124
            finally:
                stop(proc)

    def start(self, argv: list[str], log: str, env: dict[str, str]) -> subprocess.Popen | None:
        print(f"$ {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)} &  > {log}", flush=True)
        if self.dry_run:
            return None
        out = open(self.work / log, "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, **env})
        out.close()
        STARTED.append(proc)
        return proc

    def tail(self, log: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.work / log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``timeout``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until ``url`` answered 200 (RuntimeError if the process exits or the time runs out)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server was not ready within {timeout:g} s")


def install(step: Step, engine: str, venv: Path) -> str:
    """A venv with the server and scaffold (scaffold constrained to the server's torch); its python."""
    spec = ENGINES[engine]
    python = str(venv / "bin" / "python")
    if step.run([sys.executable, "-m", "venv", str(venv)], f"install-{engine}.log"):
        raise RuntimeError("creating the virtual environment failed")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    for argv in ([*pip, "--upgrade", "pip"], [*pip, *spec["server"]]):
        if step.run(argv, f"install-{engine}.log", timeout=3600):
            raise RuntimeError(f"{shlex.join(argv)} failed: see {step.work / f'install-{engine}.log'}")
    constraints = step.work / f"constraints-{engine}.txt"
    if not step.dry_run:
        frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
        constraints.write_text("".join(line + "\n" for line in frozen.splitlines()
                                       if line.split("==")[0].lower() in ("torch", "torchvision", "torchaudio",
                                                                         "triton")))
    editable = [a for path in [*SCAFFOLD, spec["plugin"] + "[test]"] for a in ("-e", str(ROOT / path))]
    if step.run([*pip, "-c", str(constraints), *editable, "pytest>=8"], f"install-{engine}.log", timeout=3600):
        raise RuntimeError(f"installing scaffold failed: see {step.work / f'install-{engine}.log'}")
    return python


def save_checkpoint(step: Step, python: str, model: str, target: Path) -> None:
    """``model`` saved with save_pretrained (safetensors) at ``target``: what the weight updates load."""
    if (target / "config.json").exists():
        return
    code = ("import sys, transformers as t; m, d = sys.argv[1:]; "
            "t.AutoModelForCausalLM.from_pretrained(m, torch_dtype='auto').save_pretrained(d, safe_serialization=True);"
            " t.AutoTokenizer.from_pretrained(m).save_pretrained(d)")
    if step.run([python, "-c", code, model, str(target)], "checkpoint.log", timeout=3600):
        raise RuntimeError(f"saving {model} failed: see {step.work / 'checkpoint.log'}")


def server_argv(engine: str, python: str, model: str, port: int, fake: bool) -> list[str]:
    spec = ENGINES[engine]
    prefix = [python, *(spec["fake"] if fake else spec["command"])]
    model_args = [spec["model_flag"], model] if spec["model_flag"] else [model]
    extra = ["--vocab-size", "49152", "--mean-tokens", "200", "--token-delay-ms", "2"] if fake else spec["serve_args"]
    if fake and engine == "vllm":
        extra += ["--worker-extension-cls", "scaffold_vllm.worker_extension.WeightLoader"]
    return [*prefix, *model_args, "--host", "127.0.0.1", "--port", str(port), *extra]


def pytest_counts(report: Path) -> dict[str, Any]:
    """passed / failed / skipped / errors from a junit XML report, and the failing tests' names."""
    import xml.etree.ElementTree as ET

    if not report.exists():
        return {"error": "no report"}
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed" if case.find("failure") is not None else "errors"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def check(step: Step, engine: str, python: str, model: str, checkpoint: Path, fake: bool) -> dict[str, Any]:
    """Serve ``model`` as a user would and run the live checks against it."""
    spec = ENGINES[engine]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = step.start(server_argv(engine, python, model, port, fake), f"serve-{engine}.log", spec["env"])
    out: dict[str, Any] = {}
    try:
        if proc is not None:
            out["server_ready_s"] = round(wait_healthy(url + spec["health"], proc, 1800), 1)
        report = step.work / f"checks-{engine}.xml"
        variable = spec["variable"]
        env = {f"SCAFFOLD_{variable}_URL": url, f"SCAFFOLD_{variable}_CHECKPOINT": str(checkpoint)}
        code = step.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                         f"--junitxml={report}", *spec["checks"]], f"checks-{engine}.log",
                        env=env, timeout=3600)
        out.update(exit_code=code, **({} if step.dry_run else pytest_counts(report)))
    except RuntimeError as exc:
        out["error"] = f"{exc}; log tail:\n{step.tail(f'serve-{engine}.log')}"
    finally:
        if proc is not None:
            stop(proc)
    return out


def train_config(engine: str, policy: str, python: str, fake: bool) -> dict[str, Any]:
    spec = ENGINES[engine]
    launch: dict[str, Any] = {"model_path": policy, "extra_args": list(spec["launch_args"])}
    if fake:
        launch.update(command=[python, *spec["fake"]], extra_args=["--vocab-size", "49152", "--mean-tokens", "6"])
        if engine == "vllm":
            launch["extra_args"] += ["--worker-extension-cls", "scaffold_vllm.worker_extension.WeightLoader"]
    return {
        "task": {"name": "gsm8k", "source": "sample", "limit": 4},
        "engine": {"name": engine, "launch": launch, "setup_timeout": 1800},
        "sampling": {"max_tokens": 128, "temperature": 1.0, "seed": 0},
        "trainer": {"name": "trl", "policy": policy, "max_steps": 2, "num_generations": 4, "prompts_per_step": 2,
                    "learning_rate": 1e-6, "filter_groups": "none"},
    }


def train(step: Step, engine: str, python: str, policy: str, fake: bool) -> dict[str, Any]:
    """``scaffold train`` for 2 steps with the engine launching its own server; what it wrote."""
    out_dir = step.work / f"train-{engine}"
    config = step.work / f"train-{engine}.yaml"
    config.write_text(json.dumps(train_config(engine, policy, python, fake), indent=2))
    started = time.monotonic()
    code = step.run([python, "-m", "scaffold_core.cli", "train", str(config), "-o", str(out_dir), "--overwrite",
                     "--no-progress", "--no-report"], f"train-{engine}.log", timeout=3600,
                    env={"TRL_EXPERIMENTAL_SILENCE": "1"})
    out: dict[str, Any] = {"exit_code": code, "wall_s": round(time.monotonic() - started, 1)}
    if step.dry_run:
        return out
    steps = [json.loads(line) for line in (out_dir / "train_metrics.jsonl").read_text().splitlines()] \
        if (out_dir / "train_metrics.jsonl").exists() else []
    summary = json.loads((out_dir / "train_summary.json").read_text()) \
        if (out_dir / "train_summary.json").exists() else {}
    versions = token_versions(python, out_dir)
    out.update(steps=len(steps), rewards=[s.get("reward_mean", s.get("reward")) for s in steps],
               engine_weight_version=summary.get("weight_version"), token_versions=versions,
               ok=code == 0 and len(steps) == 2 and (summary.get("weight_version") or 0) >= 1
               and versions.get("max", 1) >= 1)
    if not out["ok"]:
        out["log_tail"] = step.tail(f"train-{engine}.log")
    return out


def token_versions(python: str, run_dir: Path) -> dict[str, Any]:
    """The weight versions the run's generated tokens carry (read from its store in the engine's venv)."""
    code = ("import json, sys; from scaffold_core.output import read_records; "
            "v = [x for e in read_records(sys.argv[1]) for t in e['trajectories'] "
            "for x, m in zip(t['versions'], t['loss_mask']) if m]; "
            "print(json.dumps({'min': min(v), 'max': max(v), 'tokens': len(v)} if v else {'tokens': 0}))")
    done = subprocess.run([python, "-c", code, str(run_dir)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fake_policy(work: Path) -> str:
    """A randomly initialised one-layer Llama with SmolLM2-135M-Instruct's tokenizer (--fake)."""
    target = work / "tiny-policy"
    if not (target / "config.json").exists():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from scaffold_core.engines.model_loading import load_model_and_tokenizer, resolve_model

        _, tokenizer, _ = load_model_and_tokenizer(resolve_model(None))
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id)).save_pretrained(target)
        tokenizer.save_pretrained(target)
    return str(target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a small model: hub id or local directory")
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--work", default=str(ROOT / ".gpu-engines"), help="venvs, checkpoint, logs, results")
    parser.add_argument("--no-install", action="store_true", help="use the venvs (or, with --fake, this python)")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--fake", action="store_true", help="the protocol test servers instead of real ones")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    step = Step(work, args.dry_run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {"model": args.model, "fake": args.fake, "engines": {}}
    try:
        if not args.fake and not args.dry_run:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True)
            results["gpu"] = gpu.stdout.strip() or gpu.stderr.strip()
        model = fake_policy(work) if args.fake and not args.dry_run else args.model
        for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
            print(f"\n== {engine}", flush=True)
            out: dict[str, Any] = results["engines"].setdefault(engine, {})
            try:
                venv = work / f"venv-{engine}"
                python = sys.executable if args.fake else (str(venv / "bin" / "python") if args.no_install
                                                           else install(step, engine, venv))
                checkpoint = work / "checkpoint"
                if args.fake:
                    checkpoint = Path(model)
                else:
                    save_checkpoint(step, python, model, checkpoint)
                out["checks"] = check(step, engine, python, model, checkpoint, args.fake)
                if not args.skip_train:
                    policy = model if args.fake else str(checkpoint)
                    out["train"] = train(step, engine, python, policy, args.fake)
            except RuntimeError as exc:
                out["error"] = str(exc)
            print(json.dumps(out, indent=2), flush=True)
    except KeyboardInterrupt:
        results["interrupted"] = True
    finally:
        for proc in STARTED:
            stop(proc, timeout=10)
    (work / "gpu_engines.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results))
    ok = all(not e.get("error") and e.get("checks", {}).get("failed", 0) == 0
             and e.get("checks", {}).get("errors", 0) == 0 and e.get("train", {}).get("ok", True)
             for e in results["engines"].values())
    return 0 if ok or args.dry_run else 1


if __name__ == "__main__":
    sys.exit(main())
