"""One RL step on a GPU: the project's process-supervised GRPO step against stock TRL ``GRPOTrainer``.

    python benchmarks/rl_step_gpu.py [--shape qwen3-0.6b|tiny] [--prompts 8] [--group 8]
        [--new-tokens 256] [--steps 3] [--peak-tflops 989] [--scoring-rows 8] [--out results.json]

Both sides train the same model (``benchmarks/decode_graphs.py``'s Qwen3-0.6B shape, random weights,
bf16) on the same ``--prompts`` questions of the built-in world, ``--group`` completions each:

* **stock TRL**: ``GRPOTrainer`` without vLLM, ``per_device_train_batch_size`` 8 and as many
  accumulation steps as it takes for one optimiser step per ``prompts x group`` completions (TRL
  generates them in one ``generate`` call of ``--new-tokens`` tokens, then trains in micro-batches
  of 8), a length reward (the reward's cost is nil on both sides);
* **prorag**: :class:`~prorag.stages.rl.ProcessSupervisedGRPOTrainer`, one step of the same number of
  trajectories from the rollout engine (multi-turn, BM25 retrieval, RL caps with actions of at most
  ``--new-tokens / 4`` tokens, CUDA-graph decode steps), a PRM of the policy's backbone (scalar head)
  and the dual advantage (beta 0.3), timed by part like ``benchmarks/rl_step.py``: generation, PRM
  scoring, the rest of scoring, loss (forward and backward), optimiser.

Each side runs ``--steps`` steps; the first is a warm-up (graph capture, kernel selection), the
median of the others is kept. Reported: seconds per step and the ratio (target, issue 20: prorag at
least 5x faster), tokens per step, the peak GPU memory of each side, and the loss part's model FLOPs
utilisation: 6 x matrix parameters x (prompt + completion tokens) / loss seconds / ``--peak-tflops`` (H100 SXM bf16 dense
989; target 35%). ``--shape tiny --device cpu`` runs the same code on a CPU (float32).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from decode_graphs import qwen3_shaped  # benchmarks/decode_graphs.py, beside this file
from machine import machine_name  # benchmarks/machine.py, beside this file
from rl_step import PARTS, time_step  # benchmarks/rl_step.py, beside this file

from prorag.agent.rollout_config import RolloutConfig
from prorag.data.records import read_passages, read_records
from prorag.data.world import build_world
from prorag.models.checkpoints import save_policy
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.rl import RLConfig, make_rl_trainer
from prorag.supervision.reward_model import ProcessRewardModel, reward_model_from_policy


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gb() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


def time_trl(model: Any, tokenizer: Any, questions: list[str], args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    """Seconds of each optimiser step of stock ``GRPOTrainer`` (one step = all prompts x group)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    per_device = min(8, args.prompts * args.group)
    accumulation = args.prompts * args.group // per_device
    config = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        num_generations=args.group,
        max_completion_length=args.new_tokens,
        max_steps=args.steps,
        learning_rate=1e-6,
        bf16=args.device.startswith("cuda"),
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not args.device.startswith("cuda"),
        seed=0,
    )
    steps: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync()
            steps.append(time.perf_counter() - self.start)

    def length_reward(completions: list[Any], **_: Any) -> list[float]:
        return [len(c) / 1000.0 for c in completions]

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": questions}),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    peak_memory_reset()
    trainer.train()
    timed = steps[1:] or steps
    return {"step_seconds": steps, "seconds": statistics.median(timed), "peak_memory_gb": peak_memory_gb()}


def time_prorag(
    model: Any, tokenizer: Any, records: list[Any], retriever: Any, args: argparse.Namespace, tmp: str
) -> dict[str, Any]:
    """Each part of the project's process-supervised step, per step (the first a warm-up)."""
    save_policy(model, tokenizer, Path(tmp) / "policy")
    prm = ProcessRewardModel(*reward_model_from_policy(Path(tmp) / "policy", kind="head"), kind="head")
    prm.model.to(device=args.device, dtype=model.dtype)
    n = args.prompts * args.group
    config = RLConfig(
        group_size=args.group,
        per_device_batch_size=n,
        rollout=RolloutConfig(
            max_actions=11, max_action_tokens=max(args.new_tokens // 4, 8), batch_size=n, compile_decode=args.compile_decode
        ),
        learning_rate=1e-6,
        max_steps=1,
        process_reward="prm",
        advantage="dual",
        scoring_rows=args.scoring_rows or None,
    )
    config.gradient_checkpointing = args.gradient_checkpointing
    config.compile_norms = args.compile_norms  # the trainer compiles them; the warm-up step pays it
    if args.gradient_checkpointing:  # what Trainer.train() switches on (the steps here bypass train())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = make_rl_trainer(config, Path(tmp) / "prorag", model, tokenizer, records, retriever, prm)
    trainer.rollout_func.config = replace(trainer.rollout_func.config, greedy=False, temperature=1.0)
    trainer.current_gradient_accumulation_steps = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = [dict(trainer.train_dataset[i]) for i in range(len(records)) for _ in range(args.group)]
    peak_memory_reset()
    steps = []
    part_peaks: dict[str, float] = {}

    def part_end(part: str) -> None:
        """Wait for the part's kernels; note its peak memory and start the next part's count."""
        sync()
        part_peaks[part] = max(part_peaks.get(part, 0.0), peak_memory_gb())
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    checkpointing = getattr(model, "is_activation_checkpointing", getattr(model, "is_gradient_checkpointing", None))
    resident = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    for _ in range(args.steps):
        sync()
        steps.append(time_step(trainer, rows, optimizer, part_end))
    timed = steps[1:] or steps
    keys = (*PARTS, "total", "tokens", "model_tokens", "sequence_tokens")
    median = {part: statistics.median(s[part] for s in timed) for part in keys}
    result = {
        "steps": steps,
        "median": median,
        "peak_memory_gb": max(part_peaks.values()),
        "part_peak_memory_gb": part_peaks,
        "resident_before_gb": resident,
        "gradient_checkpointing": checkpointing,
    }
    if args.profile:
        result["loss_profile"] = profile_loss(trainer, rows)
    return result


def profile_loss(trainer: Any, rows: list[dict[str, Any]]) -> str:
    """The loss part (forward and backward) of one more step under ``torch.profiler``: the
    operators by their own device time (CPU time off a GPU), as a printed table."""
    from torch.profiler import ProfilerActivity, profile

    batch = trainer._generate_and_score_completions([dict(r) for r in rows])
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        trainer.compute_loss(trainer.model, batch).backward()
        sync()
    trainer.model.zero_grad(set_to_none=True)
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=("qwen3-0.6b", "tiny"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256, help="TRL's max completion length; prorag's action cap is a quarter")
    ap.add_argument("--steps", type=int, default=3, help="steps per side (the first is a warm-up)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's bf16 dense peak, for MFU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--scoring-rows", type=int, default=8, help="prorag's rows per log-probability forward (rl.scoring_rows; 0: all at once)"
    )
    ap.add_argument("--sides", default="trl,prorag", help="which sides to run (comma-separated)")
    ap.add_argument(
        "--gradient-checkpointing", action="store_true", help="prorag's loss recomputes activations (TRL's side always does)"
    )
    ap.add_argument("--profile", action="store_true", help="then profile prorag's loss part (forward and backward) once")
    ap.add_argument("--compile-norms", action="store_true", help="prorag's policy with its RMSNorms compiled (rl.compile_norms)")
    ap.add_argument(
        "--compile-decode",
        action="store_true",
        help="prorag's rollouts decode with the static step compiled whole before capture (rl.rollout.compile_decode)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    sides = set(args.sides.split(","))

    with tempfile.TemporaryDirectory() as tmp:
        build_world(tmp, seed=0, size="demo")
        tokenizer = train_world_tokenizer(world_tokenizer_texts(tmp))
        retriever = BM25Retriever(read_passages(Path(tmp) / "corpus.jsonl"))
        records = read_records(Path(tmp) / "train.jsonl")[: args.prompts]
        result: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "machine": machine_name(args.device),
            "shape": args.shape,
            "torch": torch.__version__,
            "args": {k: v for k, v in vars(args).items() if k != "out"},
        }
        if "trl" in sides:
            model = qwen3_shaped(tokenizer, args.shape, args.device, dtype).train()
            result["trl"] = time_trl(model, tokenizer, [r.question for r in records], args, str(Path(tmp) / "trl"))
            del model
        if "prorag" in sides:
            model = qwen3_shaped(tokenizer, args.shape, args.device, dtype).train()
            result["parameters"] = sum(p.numel() for p in model.parameters())
            # The embedding is a lookup; every other weight is a matrix product, forward and backward.
            result["matmul_parameters"] = result["parameters"] - model.get_input_embeddings().weight.numel()
            result["prorag"] = time_prorag(model, tokenizer, records, retriever, args, tmp)

    print(f"{result['machine']}, {args.shape} shape, {args.prompts} prompts x G {args.group}, torch {torch.__version__}")
    if "prorag" in result:
        p = result["prorag"]["median"]
        mfu = 6 * result["matmul_parameters"] * p["sequence_tokens"] / p["loss"] / (args.peak_tflops * 1e12)
        result["prorag"]["loss_mfu"] = mfu
        print(
            f"prorag step {p['total']:.2f} s ({p['model_tokens']:.0f} model tokens of {p['tokens']:.0f}), peak {result['prorag']['peak_memory_gb']:.1f} GB"
        )
        for part in PARTS:
            print(f"  {part:<16}{p[part]:>8.2f} s{p[part] / p['total']:>8.1%}")
        print(f"  loss MFU {mfu:.1%} of {args.peak_tflops:.0f} TFLOP/s (target 35%)")
        peaks = result["prorag"]["part_peak_memory_gb"]
        print(
            f"  memory (gradient checkpointing {result['prorag']['gradient_checkpointing']}): "
            f"{result['prorag']['resident_before_gb']:.1f} GB resident before the steps; peak by part "
            + ", ".join(f"{part} {gb:.1f} GB" for part, gb in peaks.items())
        )
        if "loss_profile" in result["prorag"]:
            print(result["prorag"]["loss_profile"])
    if "trl" in result:
        t = result["trl"]
        print(
            f"stock TRL GRPOTrainer step {t['seconds']:.2f} s (steps {', '.join(f'{s:.1f}' for s in t['step_seconds'])}), peak {t['peak_memory_gb']:.1f} GB"
        )
    if "trl" in result and "prorag" in result:
        ratio = result["trl"]["seconds"] / result["prorag"]["median"]["total"]
        result["speedup"] = ratio
        print(f"prorag over stock TRL: {ratio:.2f}x per step (target 5x: {'met' if ratio >= 5 else 'NOT met'})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
