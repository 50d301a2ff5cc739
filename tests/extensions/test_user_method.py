"""A user's extension, written as a user would: a plugin module outside the package registers a
toy process reward (a step-reward source with its own settings class) and a toy evaluation
baseline, and the real commands run them by name, in processes of their own that load the plugin
from ``PRORAG_PLUGINS``. Nothing in the package names them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.data.jsonl import read_jsonl
from prorag.models.checkpoints import save_policy
from prorag.retrieval.index import build_index

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""A toy process reward and a toy baseline, registered on import."""

from dataclasses import dataclass

from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES, EvalBaseline, naive_prompt
from prorag.method.rewards.sources import STEP_REWARD_SOURCES


@dataclass
class ToyConfig:
    value: float = setting(1.0, help="The step reward of every action.")


class ToySteps:
    final = True  # step rewards already: the trainer applies no Eq. 5

    def __init__(self, value):
        self.value = value

    def __call__(self, trajectories, records=None, group_ids=None):
        return [[self.value] * len(t.actions) for t in trajectories]


@STEP_REWARD_SOURCES.register("toy", config=ToyConfig, help="the same step reward for every action")
def toy_steps(config, *, device=None):
    return ToySteps(config.toy.value)


@EVAL_BASELINES.register("toy", help="answers 'toy' to every question")
class ToyBaseline(EvalBaseline):
    def prompts(self, tokenizer, records, retriever, k, style):
        return [naive_prompt(tokenizer, r.question, style) for r in records], {}

    def answer(self, traj, tokenizer):
        return "toy"
'''


def scripted_policy(tokenizer: Any, out: Path) -> Path:
    """A tiny policy checkpoint that writes ``<step> w </step><answer> v </answer>`` after any
    prompt, whatever it samples: one action per trajectory for the step reward to score, in a
    fraction of the time a trained policy would take. Attention and MLP outputs are zeroed, so the
    next token depends on the current token's embedding alone; the script's tokens get orthogonal
    embeddings (every other token shares one) and the LM head maps each to its successor."""
    from transformers import AutoModelForCausalLM

    from prorag.agent.schema import ANSWER_CLOSE, ANSWER_OPEN, STEP_CLOSE, STEP_OPEN
    from prorag.models.tiny import tiny_model_config

    config = tiny_model_config(len(tokenizer))
    config.tie_word_embeddings = False
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    words = [i for i in range(len(tokenizer)) if tokenizer.convert_ids_to_tokens(i).isalpha()][:2]
    tag = tokenizer.convert_tokens_to_ids
    script = [tag(STEP_OPEN), words[0], tag(STEP_CLOSE), tag(ANSWER_OPEN), words[1], tag(ANSWER_CLOSE)]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        basis = torch.eye(embed.shape[1])
        embed[:] = basis[0]
        head.zero_()
        head[script[0]] = 5.0 * basis[0]  # any other token (the prompt's last) -> <step>
        for k, (token, successor) in enumerate(zip(script, script[1:], strict=False), start=1):
            embed[token] = basis[k]
            head[successor] = 5.0 * basis[k]
    return save_policy(model, tokenizer, out)


def prorag(args: list[str], plugins: Path) -> subprocess.CompletedProcess[str]:
    """``python -m prorag.cli ARGS`` with the plugin folder on the path and its module in ``PRORAG_PLUGINS``."""
    path = os.pathsep.join([str(plugins), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, PRORAG_PLUGINS="toy_plugin", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-m", "prorag.cli", *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_plugin_s_process_reward_and_baseline_run_by_name(tmp_path: Path, tiny_world: Path, world_tokenizer: Any) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "toy_plugin.py").write_text(PLUGIN)
    policy = scripted_policy(world_tokenizer, tmp_path / "policy")
    index = tmp_path / "index"
    build_index(tiny_world / "corpus.jsonl", index, kind="bm25")
    common = ["--policy", str(policy), "--index", str(index)]

    run = tmp_path / "rl"
    rollout = ["rollout.max_actions=2", "rollout.max_action_tokens=8", "rollout.max_completion_tokens=24"]
    settings = ["process_reward=toy", "rl.toy.value=0.5", "group_size=2", "per_device_batch_size=4", "limit=2", *rollout]
    sets = [arg for s in [*settings, "log_kl_to_init=false", "save_steps=1"] for arg in ("--set", s)]
    prorag(["rl", *common, "--data", str(tiny_world / "train.jsonl"), "--run-dir", str(run), "--max-steps", "1", *sets], plugins)
    saved = json.loads((run / "rl_config.json").read_text())
    assert saved["process_reward"] == "toy" and saved["toy"] == {"value": 0.5}  # the dump holds the toy's section
    steps = [row for row in read_jsonl(run / "metrics.jsonl") if "process_reward" in row]
    assert [row["step"] for row in steps] == [1] and steps[0]["process_steps_per_trajectory"] == 1.0  # one scored action each
    assert steps[0]["process_reward"] == pytest.approx(0.5)  # the toy's setting, scored by the toy

    out = tmp_path / "eval"
    prorag(
        ["eval", *common, "--data", str(tiny_world / "test.jsonl"), "--out", str(out), "--baseline", "toy", "--limit", "2"],
        plugins,
    )
    predictions = list(read_jsonl(out / "predictions.jsonl"))
    assert [p["prediction"] for p in predictions] == ["toy", "toy"]
    assert json.loads((out / "metrics.json").read_text())["n"] == 2
