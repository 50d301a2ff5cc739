"""The SDPA kernels variable-shape forwards may use: every kernel but cuDNN's, inside the block only."""

from __future__ import annotations

import pytest
import torch

from prorag.core.kernels import NORM_RECOMPILE_LIMIT, compile_norms, variable_shape_attention


def _enabled() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {
        "cudnn": cuda.cudnn_sdp_enabled(),
        "flash": cuda.flash_sdp_enabled(),
        "efficient": cuda.mem_efficient_sdp_enabled(),
        "math": cuda.math_sdp_enabled(),
    }


@pytest.mark.parametrize("cudnn_before", [True, False])
def test_cudnn_attention_is_off_inside_the_block_and_as_it_was_after(cudnn_before: bool) -> None:
    saved = _enabled()
    torch.backends.cuda.enable_cudnn_sdp(cudnn_before)
    try:
        before = _enabled()
        with variable_shape_attention():
            assert _enabled() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
            q = torch.randn(2, 4, 5, 8)
            mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        assert _enabled() == before
        reference = torch.softmax((q @ q.transpose(-1, -2) / 8**0.5).masked_fill(~mask, float("-inf")), -1) @ q
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(saved["cudnn"])


def test_compile_norms_compiles_each_rms_norm_once_and_changes_no_output() -> None:
    """Every RMSNorm of a Qwen3 (four per layer and the final one) is compiled, nothing else; the
    logits and gradients are the eager ones (``aot_eager``: the same graph capture, no code generation)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=50, attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    ids = torch.randint(0, 50, (3, 7))
    reference = model(ids, labels=ids)
    reference.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    from torch._dynamo.utils import counters

    counters.clear()
    assert compile_norms(model, backend="aot_eager") == 2 * 4 + 1
    assert compile_norms(model, backend="aot_eager") == 0, "compiled modules are left alone"
    compiled = {type(m).__name__ for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None}
    assert compiled == {"Qwen3RMSNorm"}
    import torch._dynamo.config as dynamo_config

    assert dynamo_config.recompile_limit >= NORM_RECOMPILE_LIMIT
    for shape in ((3, 7), (5, 4)):  # another batch and length: the same dynamic compilation
        x = ids if shape == (3, 7) else torch.randint(0, 50, shape)
        got = model(x, labels=x)
        if shape == (3, 7):
            torch.testing.assert_close(got.logits, reference.logits, rtol=1e-5, atol=1e-6)
            got.loss.backward()
            for name, p in model.named_parameters():
                torch.testing.assert_close(p.grad, grads[name], rtol=1e-5, atol=1e-6, msg=name)
        assert torch.isfinite(got.loss)
    # Decode-shaped calls (one position, one row) and no-grad calls are variants of their own: more
    # than dynamo's default limit of 8, every one compiled (none left to the eager fallback).
    with torch.no_grad():
        for shape in ((5, 1), (1, 1), (1, 7), (4, 3)):
            model(torch.randint(0, 50, shape))
    assert counters["stats"]["unique_graphs"] > 8
    assert counters["frames"]["ok"] == counters["frames"]["total"]
