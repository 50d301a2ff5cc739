"""The SDPA kernels variable-shape forwards may use: every kernel but cuDNN's, inside the block only."""

from __future__ import annotations

import pytest
import torch

from prorag.models.attention_kernels import variable_shape_attention


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
