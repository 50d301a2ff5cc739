"""The RL runs of a pipeline run folder (``probes/NAME/``) as weights and evaluations on disk.

A run's last weights are its newest complete checkpoint, except for a LoRA run, whose checkpoints
hold the adapter only: there ``policy/`` is the last model merged when the run kept its last step,
and a LoRA run that let dev choose is refused, since neither folder is then its last model. Written
policies and evaluations are kept once complete (a policy is renamed into place, an evaluation is
done when its ``metrics.json`` exists), so a stopped study resumes where it was.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import save_file

from prorag.data.jsonl import read_json
from prorag.stages.training import last_complete_checkpoint

#: The weights file of a policy or checkpoint folder (the small models save one file, unsharded).
WEIGHTS = "model.safetensors"


def last_checkpoint(run: Path) -> Path:
    """A run's newest complete checkpoint (:func:`~prorag.stages.training.last_complete_checkpoint`)."""
    found = last_complete_checkpoint(run / "checkpoints")
    if found is None:
        raise FileNotFoundError(f"{run}/checkpoints: no complete checkpoint-N folder (did the run finish?)")
    return found[0]


def last_weights(run: Path) -> Path:
    """The folder holding a run's last weights as a whole model: its newest checkpoint, or, where that
    checkpoint is a LoRA adapter (``adapter_config.json``, no merged weights), ``policy/``, which
    holds the merged last weights when the run kept its last step (``select_policy: last``)."""
    checkpoint = last_checkpoint(run)
    if not (checkpoint / "adapter_config.json").is_file():
        return checkpoint
    if read_json(run / "rl_config.json").get("select_policy") != "last":
        raise ValueError(f"{checkpoint}: a LoRA adapter, and {run}/policy is not the last step (select_policy is not 'last')")
    return run / "policy"


def write_policy(base_policy: Path, weights: dict[str, torch.Tensor], out: Path) -> Path:
    """A policy folder: ``weights`` as safetensors beside a copy of ``base_policy``'s other files
    (config, tokenizer), written under a temporary name and renamed into place."""
    if (out / WEIGHTS).is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in base_policy.iterdir():
        if path.is_file() and path.name != WEIGHTS:
            shutil.copy2(path, tmp / path.name)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS))
    tmp.rename(out)
    return out


def evaluate(run: Path, policy: Path, data: Path, out: Path) -> Path:
    """``prorag eval`` of ``policy`` on ``data`` with the run's index into ``out``, greedily and with
    the RL runs' own test budget (``--max-actions 11``), one torch thread; kept if its metrics.json
    exists. The command's output goes to ``OUT.log``."""
    if not (out / "metrics.json").is_file():
        command = ["prorag", "eval", "--policy", str(policy), "--data", str(data), "--index", str(run / "index")]
        command += ["--out", str(out), "--max-actions", "11"]
        log = out.with_name(out.name + ".log")
        with open(log, "w") as f:
            done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed (exit {done.returncode}); see {log}")
    return out
