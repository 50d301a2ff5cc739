"""The slot cache's batch state: a chunk fed to some rows only runs those rows through the model,
and every row still reads what a clean forward over its own tokens gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prorag.agent.kv_cache import SlotState
from tests.agent.test_rollout import _tiny_llama


def _clean_last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_a_chunk_for_some_rows_runs_only_those_and_leaves_the_others_as_they_were(world_tokenizer: Any) -> None:
    model = _tiny_llama(world_tokenizer).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [17, 18]]
    chunks = [[20, 21, 22], None, [23], None]
    state = SlotState(model, len(prompts), world_tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        state.feed(prompts)
        layer = state.cache.layers[0]
        keys_before = layer.keys.clone()

        calls: list[tuple[int, list[int]]] = []
        hook = model.model.register_forward_pre_hook(
            lambda _m, _a, kw: calls.append((kw["input_ids"].shape[0], state.cache.forward_rows.tolist())), with_kwargs=True
        )
        logits = state.feed(chunks)
        hook.remove()
    assert calls == [(2, [0, 2])], "only the two rows with a chunk run through the model"
    assert state.cache.forward_rows.tolist() == [0, 1, 2, 3]
    assert state.length.tolist() == [8, 3, 5, 2] and state.longest == 8
    for r in (0, 2):
        torch.testing.assert_close(logits[r], _clean_last_logits(model, prompts[r] + chunks[r]), rtol=1e-5, atol=1e-5)
    assert not logits[1].any() and not logits[3].any(), "a row without a chunk gets zero logits"
    # Rows without a chunk: their cache untouched; the fed rows' prompts kept, their chunk written after them.
    torch.testing.assert_close(layer.keys[[1, 3]], keys_before[[1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(layer.keys[0, :, :5], keys_before[0, :, :5], rtol=0, atol=0)
    assert not torch.equal(layer.keys[0, :, 5:8], keys_before[0, :, 5:8])

    # The next decode step of every row reads a cache as if each row had been fed alone.
    nxt = torch.tensor([30, 31, 32, 33])
    with torch.no_grad():
        step = state.feed_step(nxt, torch.ones(4, dtype=torch.bool))
    for r in range(4):
        seq = prompts[r] + (chunks[r] or []) + [int(nxt[r])]
        torch.testing.assert_close(step[r], _clean_last_logits(model, seq), rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="at least one row"):
        state.feed([None, None, None, None])


@pytest.mark.parametrize("state_class", ["SlotState", "BatchState"])
def test_the_engine_passes_the_cache_by_the_models_own_keyword(
    world_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, state_class: str
) -> None:
    """transformers renamed ``past_key_values`` to ``cache``; the old name still works but printed
    ``FutureWarning: past_key_values is deprecated`` on every eval and sft (issue 70), and reading
    ``out.past_key_values`` logs the same once. Both are shown once per process, so every one is
    recorded here, whatever ran before."""
    import logging
    import warnings

    from prorag.agent import kv_cache

    logged: list[str] = []
    monkeypatch.setattr(logging.Logger, "warning_once", lambda self, msg, *a, **k: logged.append(str(msg)), raising=False)
    model = _tiny_llama(world_tokenizer).eval()
    state = getattr(kv_cache, state_class)(model, 2, world_tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.feed([[5, 6, 7], [8, 9]])
        step = state.feed_step(torch.tensor([10, 11]), torch.ones(2, dtype=torch.bool))
    assert step.shape[0] == 2 and state.cache is not None
    assert [m for m in logged + [str(w.message) for w in caught] if "past_key_values" in m] == []
