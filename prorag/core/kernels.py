"""Which kernels the project's forwards run on a GPU: attention without cuDNN's per-shape set-up,
RMSNorm fused into one kernel, and the decode step compiled whole.

**Attention.** On Hopper GPUs PyTorch's SDPA often picks cuDNN's attention, which builds an execution
graph on the host for each new input shape. The RL loss (rows in groups cut to their span,
:func:`~prorag.stages.rl.length_sorted_groups`) and the rollout engine's eager forwards change shape
nearly every call, and profiled, that host set-up far outweighed the attention's GPU time. The flash
and memory-efficient kernels have no such set-up, so these forwards run without cuDNN's
(:func:`variable_shape_attention`): the engine's always, the trainers' unless a stage sets
``cudnn_attention`` (fixed-shape batches of a large model may prefer it). Captured decode graphs keep
PyTorch's choice: a replay does no host work.

**Fusion**, opt-in, paid by a compilation on first use: :func:`compile_norms` (``compile_norms``) fuses
each RMSNorm into one kernel; :func:`compile_static_step` (``compile_decode``) compiles the static decode
step so the small elementwise kernels a graph replays fuse around the matrix products.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

#: The SDPA kernels a variable-shape forward may use, in PyTorch's order of preference: all but cuDNN's.
VARIABLE_SHAPE_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@contextlib.contextmanager
def variable_shape_attention() -> Iterator[None]:
    """Inside the block, scaled-dot-product attention runs without cuDNN's kernel (see the module
    docstring). The choice holds for the backward of what the block computes too (autograd records
    the kernel the forward ran), except where gradient checkpointing recomputes a forward during the
    backward: the recomputation picks its kernel afresh, so the backward must run inside the block as
    well, or the recomputed tensors differ from the saved ones and the backward fails (cuDNN's kernel
    chosen on recomputation). The trainers' ``training_step`` holds both (``TrainerKernels``).
    On a CPU it changes nothing (cuDNN attention is CUDA-only)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in VARIABLE_SHAPE_KERNELS]):
        yield


def training_attention(cudnn: bool) -> contextlib.AbstractContextManager[Any]:
    """The attention kernels of a trainer's forwards: PyTorch's own choice with ``cudnn``
    (``TrainingConfig.cudnn_attention``), else :func:`variable_shape_attention`."""
    return contextlib.nullcontext() if cudnn else variable_shape_attention()


def is_rms_norm(module: Any) -> bool:
    """Whether ``module`` is an RMSNorm layer (transformers names them ``*RMSNorm``)."""
    return type(module).__name__.endswith("RMSNorm")


#: Compilations dynamo keeps per code object (its default is 8). Every RMSNorm of a model runs the
#: same ``forward``, and each input rank (hidden states, per-head queries and keys), each size-1
#: dimension (one row, one position: decode steps) and each grad mode is a variant of its own: a
#: Qwen3 in inference alone met 8 (tests), and past the limit dynamo falls back to the eager norm.
#: :func:`compile_static_step` raises it too (a decode step meets a few variants of its own).
NORM_RECOMPILE_LIMIT = 64


def _raise_recompile_limit() -> None:
    """Raise dynamo's per-code recompile limit to :data:`NORM_RECOMPILE_LIMIT` (process-wide, never lowered)."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, NORM_RECOMPILE_LIMIT)


def compile_norms(model: Any, backend: str = "inductor") -> int:
    """Compile every RMSNorm module of ``model`` in place (``torch.compile``, dynamic shapes, with
    ``backend``); returns how many. Idempotent: a module compiled already is left alone. The
    modules' parameters and outputs are unchanged, up to float rounding of the fused kernel.
    Raises dynamo's per-code recompile limit to :data:`NORM_RECOMPILE_LIMIT` (process-wide, never lowered).

    Why: transformers' RMSNorm (Llama, Qwen2/3, Mistral) is some seven elementwise kernels per call
    (up-cast, square, mean, add, rsqrt, multiply, down-cast and scale), and a Qwen3 layer calls four
    (input, post-attention, query and key norms); profiled, elementwise multiplications alone took more
    GPU time than the matrix products. Compiled, each norm is one kernel, forward and backward; the
    modules around it stay eager, so the slot cache and the decode graphs are untouched (a graph
    records the fused kernel)."""
    _raise_recompile_limit()
    count = 0
    for module in model.modules():
        if is_rms_norm(module) and getattr(module, "_compiled_call_impl", None) is None:
            module.compile(dynamic=True, backend=backend)
            count += 1
    return count


def compile_static_step(step: Callable[..., Any], backend: str = "inductor") -> Callable[..., Any]:
    """``step`` (a static decode step: fixed buffers, bucketed shapes) compiled whole with
    ``torch.compile`` (dynamic shapes, ``backend``), to be called, and captured, in its place.
    Compiles lazily, on the first call (CUDA graphs: the warm-up before each capture). Raises
    dynamo's recompile limit as :func:`compile_norms` does: a step meets a few variants (one row,
    the cache's full width) and past the limit dynamo would run it uncompiled.

    Why: a captured decode graph replays every kernel of the step, hundreds for a Qwen3-0.6B, most of
    them small elementwise ones (norms, rotary embeddings, residual adds, casts) that take a few
    microseconds each whatever their size, so the graph takes several times what reading the weights
    once takes. Compiled as one program, that work fuses around the matrix products. On a CPU the
    compiled step decodes at the eager step's speed (the step there is matrix products and attention):
    its reason is the GPU."""
    import torch

    _raise_recompile_limit()
    return torch.compile(step, dynamic=True, backend=backend)
