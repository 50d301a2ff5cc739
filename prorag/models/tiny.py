"""Tiny randomly initialised policies (Llama or Qwen3, ~1M or ~5M parameters) for the built-in
world and for tests: real transformers models, deterministic per seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prorag.core.lazy_modules import lazy_module
from prorag.models.tags import configure_generation, has_tags

if TYPE_CHECKING:  # imported lazily at run time: torch and transformers are slow to import
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
else:
    torch = lazy_module("torch")

#: (hidden, layers, heads, intermediate) of each size; the head size is hidden / heads.
TINY_SIZES: Mapping[str, tuple[int, int, int, int]] = {
    "tiny": (128, 4, 4, 384),
    "small": (256, 6, 8, 640),
}


def tiny_model_config(vocab_size: int, size: str = "tiny", *, arch: str = "llama") -> PretrainedConfig:
    """A real transformers config (``LlamaConfig``, or ``Qwen3Config`` with ``arch="qwen3"``)
    for a small randomly initialised policy.

    =======  ======  ======  =====  ============  ==================================
    size     hidden  layers  heads  intermediate  parameters (vocab 4096; llama/qwen3)
    =======  ======  ======  =====  ============  ==================================
    tiny     128     4       4      384           1,377,408 / 1,377,664
    small    256     6       8      640           5,573,888 / 5,574,272
    =======  ======  ======  =====  ============  ==================================

    Both: full multi-head attention (as many KV heads as heads), 2048 positions, RoPE,
    SwiGLU MLP, RMSNorm, tied input/output embeddings (``vocab * hidden`` of the total, e.g.
    524,288 for tiny at vocab 4096), no biases. The counts are measured (and tested); with
    another vocabulary add or subtract ``hidden`` per token: the world tokenizer of a built-in
    world has about 2,480 tokens, giving ~1.17M (tiny) and ~5.16M (small) parameters. Qwen3 adds a per-head RMSNorm on
    queries and keys (``2 * head_dim`` per layer). BOS/EOS/PAD ids are left unset
    (:func:`make_tiny_model` takes them from the tokenizer).
    """
    if size not in TINY_SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(TINY_SIZES)}")
    hidden, layers, heads, intermediate = TINY_SIZES[size]
    common: dict[str, Any] = dict(
        vocab_size=int(vocab_size),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(mlp_bias=False, head_dim=hidden // heads, **common)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=hidden // heads, use_sliding_window=False, **common)
    raise ValueError(f"unknown arch {arch!r}; expected 'llama' or 'qwen3'")


def make_tiny_model(
    tokenizer: PreTrainedTokenizerBase, size: str = "tiny", arch: str = "llama", seed: int = 0
) -> PreTrainedModel:
    """A randomly initialised causal LM of :func:`tiny_model_config` for ``tokenizer``.

    The vocabulary is ``len(tokenizer)`` (added tokens included); EOS and PAD ids come from
    the tokenizer (BOS from it too, ``None`` for the world tokenizer). The weights are drawn
    under ``torch.manual_seed(seed)`` inside a forked RNG, so the same seed gives identical
    weights and the caller's random state is untouched. When the tokenizer has the tags,
    generation stops at EOS or ``</answer>`` (:func:`~prorag.models.tags.configure_generation`). Float32.
    """
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(len(tokenizer), size, arch=arch)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if has_tags(tokenizer):
        configure_generation(model, tokenizer)
    return model
