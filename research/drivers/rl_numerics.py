"""How far the RL trainer's numerics move when nothing mathematical changes, and RL run that way.

    OMP_NUM_THREADS=1 python -m research.drivers.rl_numerics check [--policy DIR] [--rows 64] [--out check.json]
    OMP_NUM_THREADS=1 python -m research.drivers.rl_numerics rl --pad-columns 16 -- <the arguments of `prorag rl`>

Why: the trainer computes the policy's log-probabilities on a padded batch, and several ways of doing so
are the same function: one forward per micro-batch (``rl.scoring_rows: null``), rows in length-sorted
groups each cut to its span (``scoring_rows: 8``), or the batch with extra padding columns in front (a
causal model's real tokens never read padding; rotary positions are relative). They differ only in
float rounding. Adam then turns rounding into steps: its first update is ``lr * g / (|g| + eps)``, so a
component whose gradient is near zero moves by a full ``lr`` in whichever direction the rounding gives.
RL samples from the updated policy, so a different token soon follows and the runs part.

``check`` measures the first link of that chain on one batch: a batch of ``--rows`` trajectories with
the padding of a GRPO batch (left-padded prompts, right-padded completions of different lengths, a
retrieved span in each completion that the loss does not read), random tokens, scored by the trainer's
own ``_get_per_token_logps_and_entropies`` in each variant. It prints, against the single forward:
the largest difference of a scored token's log-probability, the relative difference of the gradient of
a policy-gradient loss, and how many gradient components change sign (each an Adam step of ``lr`` in
the other direction). The single forward run twice is the control (0 if the CPU path is deterministic).

``rl`` runs ``prorag rl`` with ``--pad-columns`` padding columns put in front of every batch the
trainer scores (loss, pi_old, pi_init): the same mathematics as ``scoring_rows: null``, other rounding.
It is how the float-path probes of docs/LOG.md (2026-11-25) were run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from prorag.data.jsonl import write_json


def left_padded(score: Callable[..., Any], columns: int) -> Callable[..., Any]:
    """``score`` (the trainer's ``_get_per_token_logps_and_entropies``) on the batch with ``columns``
    padding columns (token 0, attention 0) in front: the completion stays the last ``logits_to_keep``
    columns, so the result has the same shape and, up to rounding, the same values."""

    def padded(
        self: Any,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        ids = torch.nn.functional.pad(input_ids, (columns, 0), value=0)
        mask = torch.nn.functional.pad(attention_mask, (columns, 0), value=0)
        return score(self, model, ids, mask, logits_to_keep, *args, **kwargs)

    return padded


def padded_batch(rows: int, prompt: int, completion: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """A GRPO-shaped batch of random tokens: prompts of 1/3 to all of ``prompt`` tokens, left-padded;
    completions of 1/5 to all of ``completion`` tokens, right-padded; in each completion a retrieved
    span of 15 tokens that the loss does not read (``score``); advantages from -1 to 1 by row."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(max(1, prompt // 3), prompt + 1, (rows,), generator=g)
    clen = torch.randint(max(2, completion // 5), completion + 1, (rows,), generator=g)
    ids = torch.randint(3, vocab, (rows, prompt + completion), generator=g)
    attention = torch.zeros(rows, prompt + completion, dtype=torch.long)
    for i in range(rows):
        attention[i, prompt - int(plen[i]) : prompt] = 1
        attention[i, prompt : prompt + int(clen[i])] = 1
    score = attention[:, prompt:].clone()
    for i in range(rows):
        start = int(torch.randint(0, max(1, int(clen[i]) - 16), (1,), generator=g))
        score[i, start : start + 15] = 0
    advantages = torch.linspace(-1, 1, rows)[:, None].expand(rows, completion).contiguous()
    return {"ids": ids.masked_fill(attention == 0, 0), "attention": attention, "score": score, "advantages": advantages}


def tiny_policy(seed: int) -> Any:
    """The random built-in tiny model (:func:`~prorag.models.tiny.tiny_model_config`) over 300 token
    ids: the test's policy when no ``--policy`` is given."""
    from transformers import AutoModelForCausalLM

    from prorag.models.tiny import tiny_model_config

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_model_config(300, "tiny"), dtype=torch.float32)


def scored(
    model: Any, batch: dict[str, torch.Tensor], scoring_rows: int | None, pad_columns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's log-probabilities of the batch's completion tokens in one variant, and the
    gradient of ``-mean(A * log p)`` over the scored tokens (all parameters, flattened)."""
    from prorag.stages.rl import ProcessSupervisedGRPOTrainer

    trainer = types.SimpleNamespace(
        compact_logps=True,
        rl_config=types.SimpleNamespace(scoring_rows=scoring_rows, packed_scoring=False, packed_row_tokens=None),
        score_mask=batch["score"],
        accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext),
        cudnn_attention=False,  # the trainer's default (TrainingConfig.cudnn_attention)
    )
    score = ProcessSupervisedGRPOTrainer._get_per_token_logps_and_entropies
    if pad_columns:
        score = left_padded(score, pad_columns)
    model.zero_grad()
    logps, _, _ = score(trainer, model, batch["ids"], batch["attention"], batch["score"].size(1))
    mask = batch["score"].to(logps.dtype)
    (-(logps * batch["advantages"] * mask).sum() / mask.sum()).backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logps.detach(), grad


def check(args: argparse.Namespace) -> dict[str, Any]:
    """``check``: each variant against the single forward (see the module docstring)."""
    from trl.trainer.utils import add_fused_lm_head

    if args.policy:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32)
    else:
        model = tiny_policy(args.seed)
    add_fused_lm_head(model, temperature=1.0)
    model.train()
    batch = padded_batch(args.rows, args.prompt, args.completion, model.config.vocab_size, args.seed)
    base_logps, base_grad = scored(model, batch, None, 0)
    keep = batch["score"].bool()
    variants = {
        "single forward, again": (None, 0),
        f"scoring_rows {args.scoring_rows}": (args.scoring_rows, 0),
        f"{args.pad_columns} padding columns in front": (None, args.pad_columns),
    }
    rows = []
    for name, (scoring_rows, pad) in variants.items():
        logps, grad = scored(model, batch, scoring_rows, pad)
        row = {
            "variant": name,
            "max_abs_logp_diff": float((logps - base_logps)[keep].abs().max()),
            "grad_rel_diff": float((grad - base_grad).norm() / base_grad.norm()),
            "adam_sign_flips": int((torch.sign(grad) != torch.sign(base_grad)).sum()),
        }
        rows.append(row)
        print(
            f"{name:>32}: max |d log p| {row['max_abs_logp_diff']:.2e}, |d grad| / |grad| {row['grad_rel_diff']:.2e}, "
            f"sign flips {row['adam_sign_flips']} of {base_grad.numel()}"
        )
    return {
        "policy": str(args.policy) if args.policy else "random tiny Llama",
        "rows": args.rows,
        "scored_tokens": int(keep.sum()),
        "max_abs_logp": float(base_logps[keep].abs().max()),
        "parameters": base_grad.numel(),
        "variants": rows,
    }


def run_rl(pad_columns: int, argv: list[str]) -> None:
    """``rl``: ``prorag rl`` with :func:`left_padded` scoring."""
    from prorag.cli import main as prorag_main
    from prorag.stages import rl

    trainer = rl.ProcessSupervisedGRPOTrainer
    trainer._get_per_token_logps_and_entropies = left_padded(trainer._get_per_token_logps_and_entropies, pad_columns)  # type: ignore[method-assign]
    sys.argv = ["prorag", "rl", *argv]
    prorag_main()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="one batch's log-probabilities and gradient in each variant")
    c.add_argument("--policy", type=Path, default=None, help="a saved policy (default: a random tiny Llama)")
    c.add_argument("--rows", type=int, default=64)
    c.add_argument("--prompt", type=int, default=120, help="longest prompt")
    c.add_argument("--completion", type=int, default=160, help="longest completion")
    c.add_argument("--scoring-rows", type=int, default=8)
    c.add_argument("--pad-columns", type=int, default=16)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--out", type=Path, default=None)
    r = sub.add_parser("rl", help="prorag rl with padding columns in front of every scored batch")
    r.add_argument("--pad-columns", type=int, default=16)
    r.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the arguments of `prorag rl`")
    args = ap.parse_args()
    if args.command == "rl":
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        run_rl(args.pad_columns, rest)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    out = check(args)
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    main()
