"""The rollout engine's settings (:class:`RolloutConfig`), apart from the engine so that a config or
``--help`` can name them without importing torch.

Every config that samples holds one (``rollout.`` in YAML and ``--set``); its checks run in
``__post_init__``, so a file, the command line and Python are refused alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from prorag.agent.backends import ROLLOUT_BACKENDS
from prorag.agent.prompts import PromptStyle
from prorag.core.config import setting
from prorag.core.setting_checks import check_temperature, check_top_p

DecodeGraphsMode = Literal["auto", "off", "eager"]


@dataclass
class VLLMSettings:
    """The engine vLLM builds for ``rollout.backend: vllm`` when no trainer owns one (MCTS, RFT
    sampling, the PRM audit, evaluation). In RL the engine is TRL's: ``tensor_parallel_size``,
    ``gpu_memory_utilization`` and ``max_model_len`` pass to it; TRL sets the rest."""

    tensor_parallel_size: int = setting(1, help="GPUs one engine shards the policy over (tensor parallelism).")
    gpu_memory_utilization: float = setting(
        0.3,
        help="Share of each GPU's memory vLLM takes for the policy's weights and its KV cache, in (0, 1); the rest is "
        "left to what shares the GPU (a trainer, a PRM). 0.3 is TRL's colocated default; an engine alone on its GPU "
        "(MCTS, evaluation) can take 0.85. See docs/GPU.md.",
    )
    max_model_len: int | None = setting(
        None, help="Longest context (prompt and completion) the engine holds; default the model's own."
    )
    dtype: str = setting("auto", help="Weights' dtype in vLLM (`auto`: the checkpoint's, `bfloat16`, `float16`).")
    enforce_eager: bool = setting(False, help="Run eagerly, without CUDA graphs (less memory, slower decoding).")
    enable_prefix_caching: bool = setting(
        True, help="Reuse the KV cache of a shared prefix, so a turn does not re-read its history (the prompt, earlier actions)."
    )

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"rollout.vllm.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1), got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"rollout.vllm.max_model_len must be >= 1 (or null), got {self.max_model_len}")


def check_gpu_share(settings: VLLMSettings, needed: float, beside: str, owner: str, hint: str = "") -> None:
    """Refuse a vLLM engine (``settings``) that leaves less than ``needed`` of its GPU to what shares
    it (``beside``: a trainer, a PRM). vLLM takes ``gpu_memory_utilization`` of the GPU for the
    policy's weights and its KV cache; the rest is all the others get."""
    left = 1 - settings.gpu_memory_utilization
    if left < needed - 1e-9:
        raise ValueError(
            f"{owner}.rollout.vllm.gpu_memory_utilization {settings.gpu_memory_utilization} leaves {left:.2f} of the GPU "
            f"to {beside}, which needs at least {needed}: set it to <= {1 - needed:.2f}{hint}; see docs/GPU.md"
        )


@dataclass
class RolloutConfig:
    """Settings of the rollout engine (defaults: inference, METHOD.md section 1)."""

    max_actions: int = setting(13, help="Actions per trajectory: 13 at inference, 11 during RL.")
    max_action_tokens: int = setting(128, help="Tokens the model may write in one action before it is cut.")
    max_completion_tokens: int = setting(2048, help="Completion tokens (model and environment) per trajectory.")
    top_k: int = setting(3, help="Documents retrieved per sub-query.")
    temperature: float = setting(1.0, help="Sampling temperature, >= 0 (0: greedy decoding, as `greedy`).")
    top_p: float = setting(1.0, help="Nucleus sampling mass, in (0, 1] (1.0: off).")
    greedy: bool = setting(False, help="Greedy decoding (temperature and top_p are then ignored).")
    batch_size: int = setting(32, help="Trajectories the engine decodes together.")
    seed: int = setting(0, help="Seed of the sampling.")
    prompt_style: PromptStyle | None = setting(
        None, help="`plain` or `chat`; by default chat when the tokenizer has a chat template."
    )
    resume_early: bool = setting(
        True,
        help="Rows that closed an action get the environment's reply and go on decoding as soon as a quarter "
        "of the batch waits, beside rows still inside their action (False: at the end of the turn, when the "
        "longest action closes; finished rows then leave once a quarter of the batch has ended).",
    )
    decode_graphs: DecodeGraphsMode = setting(
        "auto",
        help="Decode steps as CUDA graphs: `auto` (on a CUDA device, for models on the slot cache), "
        "`off`, or `eager` (the same static step without capture, on any device: for tests). The graphs and "
        "the KV pool they write stay allocated while the engine lives (across RL steps); `off` frees the "
        "cache after each batch.",
    )

    compile_decode: bool = setting(
        False,
        help="Compile the static decode step whole (torch.compile, dynamic shapes) before the decode graphs capture "
        "it, so that its small elementwise kernels fuse (a GPU's gain; on a CPU it decodes at the eager step's speed). "
        "Applies where the static step runs (`decode_graphs` auto on CUDA, or eager); the first steps pay the "
        "compilation.",
    )

    backend: str = setting(
        "hf",
        choices=ROLLOUT_BACKENDS,
        help="What generates the actions, a name in ROLLOUT_BACKENDS (the loop, retrieval and caps are the same):",
    )
    vllm: VLLMSettings = setting(factory=VLLMSettings, help="The vLLM engine's settings (`backend: vllm`).")

    def __post_init__(self) -> None:
        """Refuse counts of zero (``top_k`` 0 searches for nothing, and a run of it looks fine) and
        sampling settings out of range (:mod:`prorag.core.setting_checks`)."""
        for name in ("max_actions", "max_action_tokens", "max_completion_tokens", "top_k", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be >= 1, got {getattr(self, name)}")
        check_temperature(self.temperature, f"{type(self).__name__}.temperature")
        check_top_p(self.top_p, f"{type(self).__name__}.top_p")
        if self.decode_graphs not in get_args(DecodeGraphsMode):
            raise ValueError(
                f"{type(self).__name__}.decode_graphs must be one of {get_args(DecodeGraphsMode)}, got {self.decode_graphs!r}"
            )
        ROLLOUT_BACKENDS.check(self.backend, f"{type(self).__name__}.backend")
        if isinstance(self.vllm, dict):  # asdict() of a config, handed back to the constructor
            self.vllm = VLLMSettings(**self.vllm)
        if self.compile_decode and self.decode_graphs == "off":
            raise ValueError(
                f"{type(self).__name__}.compile_decode compiles the static decode step, which decode_graphs 'off' never runs"
            )

    @property
    def decodes_greedily(self) -> bool:
        """Whether every token is the argmax: ``greedy``, or a temperature of 0 (its limit)."""
        return self.greedy or self.temperature == 0
