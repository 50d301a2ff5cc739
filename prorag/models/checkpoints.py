"""Loading a causal LM as a policy (by hub id, local folder or a stage's run folder) and writing
checkpoints: safetensors only (never pickle), atomically.

:func:`prepare_policy` is what every loaded model goes through: tags registered and embeddings
grown, a pad token, left padding, generation stopping at EOS or ``</answer>``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prorag.core.errors import DataError
from prorag.data.jsonl import PathLike, create_temp_beside
from prorag.data.safetensors_files import check_folder, load_torch
from prorag.models.tags import add_tag_tokens, configure_generation, resize_for_tags, tag_token_ids, unregistered_tags

if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: What to do about a policy folder whose weights are damaged.
POLICY_REMEDY = "restore the checkpoint, or train or export it again"
_PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth", ".ckpt", ".pickle")


def as_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; expected 'auto', a torch dtype or its name ('bfloat16', ...)")
    return value


def prepare_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0) -> None:
    """What :func:`load_policy` does to any loaded model and tokenizer, in place:

    * the tags are registered if missing (:func:`~prorag.models.tags.add_tag_tokens`) and the embeddings grown
      with rows initialised from each tag's spelling (:func:`~prorag.models.tags.resize_for_tags`), with an INFO log;
    * a missing pad token is set to the EOS token (``ValueError`` if there is no EOS);
    * padding is on the left, as batched generation needs (the prompt ends where
      generation starts);
    * generation stops at EOS or ``</answer>`` (:func:`~prorag.models.tags.configure_generation`).
    """
    vocab_before = tokenizer.get_vocab()
    missing = unregistered_tags(tokenizer)
    if missing:
        added = add_tag_tokens(tokenizer)
        ids = tag_token_ids(tokenizer)
        new_ids = [ids[t] for t in missing if t not in vocab_before]
        grown = resize_for_tags(model, tokenizer, seed=seed, new_ids=new_ids)
        log.info(
            "registered %d trajectory tags as special tokens (%d new ids); embeddings grown by %d rows, "
            "new rows set to the mean embedding of each tag's spelling",
            len(missing),
            added,
            grown,
        )
    elif model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        resize_for_tags(model, tokenizer, seed=seed)
        log.info("embeddings grown to the tokenizer's %d tokens (rows initialised from their spelling)", len(tokenizer))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
        log.info("pad token set to the eos token %r", tokenizer.eos_token)
    tokenizer.padding_side = "left"
    configure_generation(model, tokenizer)


def resolve_policy_path(name_or_path: str | Path) -> str:
    """A training stage's run folder (``prorag sft --run-dir``) stands for its final ``policy/``;
    any other value (a checkpoint folder, a hub id) is returned as it is. ``ValueError`` for a
    run folder with checkpoints but no final policy (an unfinished run)."""
    path = Path(name_or_path)
    if not path.exists() and not _looks_like_hub_id(str(name_or_path)):
        raise DataError(str(path), "no such policy folder (nor a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct)")
    if path.is_dir() and not (path / "config.json").exists():
        if (path / "policy" / "config.json").exists():
            return str(path / "policy")
        if (path / "checkpoints").is_dir():
            raise ValueError(f"{path}: run folder without a final policy/ (unfinished?); pass one of {path}/checkpoints/*")
        raise DataError(str(path), "not a checkpoint folder (no config.json) nor a training run folder (no policy/)")
    return str(name_or_path)


def weights_digest(folder: str | Path) -> str | None:
    """A short SHA-256 of the ``*.safetensors`` files in ``folder`` (their contents, in name
    order), or ``None`` where there are none (a hub id, a folder without weights).

    What a stage that stores a model's outputs for reuse records about the model: a digest of the
    weights, not the path, so that a model retrained in place is not taken for the old one, and
    one checkpoint reached by two spellings of its path is one model."""
    path = Path(folder)
    weights = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not weights:
        return None
    h = hashlib.sha256()
    for file in weights:
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a hub id (``name`` or ``namespace/name``): a path that
    does not exist and cannot be a hub id is refused at once rather than by the hub's offline error."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", name) is not None and ".." not in name


def load_policy(
    name_or_path: str, *, dtype: str | torch.dtype = "auto", device: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer by hub id or local folder, ready to be a policy.

    ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (the hub is
    contacted only for a hub id that is not cached). ``dtype`` is ``"auto"`` (the
    checkpoint's own dtype), a torch dtype or its name; ``device`` moves the model (e.g.
    ``"cuda"``), default stays on the CPU. Then :func:`prepare_policy`: tags registered
    (rows initialised from the tags' spelling), pad token set, left padding, generation stopping at EOS or
    ``</answer>``. Works for checkpoints written by :func:`save_policy` and
    :func:`~prorag.models.offline.setup_offline` as for any hub model, and for a training stage's run folder
    (:func:`resolve_policy_path`). A folder's damaged weights file is a ``DataError`` naming it
    (:func:`~prorag.data.safetensors_files.check_folder`), before transformers reads it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path = resolve_policy_path(name_or_path)
    check_folder(name_or_path, remedy=POLICY_REMEDY)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except OSError as e:  # neither a checkpoint folder nor a cached or reachable hub model
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            name_or_path, f"cannot load a policy: not a checkpoint folder, not a reachable hub model ({first})"
        ) from None
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=as_dtype(dtype))
    prepare_policy(model, tokenizer)
    if device is not None:
        model.to(device)
    return model, tokenizer


@dataclass
class PolicyFolder:
    """A policy that a backend loads itself (vLLM): its folder, config (its context length) and
    generation config (its end-of-sequence ids), without its weights in this process."""

    name_or_path: str
    config: Any
    generation_config: Any


def load_sampler(
    name_or_path: str, rollout: Any, *, dtype: str | torch.dtype = "auto", device: str | None = None
) -> tuple[Any, PreTrainedTokenizerBase]:
    """The policy and tokenizer a stage samples with on ``rollout.backend``: :func:`load_policy` for a
    backend that runs the model in this process (``hf``), else a :class:`PolicyFolder` (no weights
    loaded: the backend's engine loads them, so the GPU holds them once) and the folder's tokenizer,
    which must already hold the trajectory tags (a policy saved by a prorag stage)."""
    from prorag.agent.backends import ROLLOUT_BACKENDS

    if ROLLOUT_BACKENDS.get(rollout.backend).in_process:
        return load_policy(name_or_path, dtype=dtype, device=device)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    path = resolve_policy_path(name_or_path)
    check_folder(path, remedy=POLICY_REMEDY)
    tokenizer = AutoTokenizer.from_pretrained(path)
    missing = unregistered_tags(tokenizer)
    if missing:
        raise DataError(
            path,
            f"rollout.backend {rollout.backend!r} needs a policy whose tokenizer holds the trajectory tags (one a "
            f"prorag stage saved, e.g. `prorag sft`'s policy/); missing {missing}",
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = AutoConfig.from_pretrained(path)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    return PolicyFolder(path, config, generation), tokenizer


def fresh_dir(beside: Path, kind: str) -> Path:
    """A new empty folder ``.NAME.KIND-…`` next to ``beside`` (created with the umask's
    permissions, unlike ``tempfile.mkdtemp``'s 0700, so a checkpoint is as readable as any
    other file the user writes)."""
    for _ in range(100):
        path = beside.parent / f".{beside.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"cannot create a temporary folder beside {beside}")


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: PathLike,
    *,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model`` (safetensors, config, generation config when it has one) and
    ``tokenizer`` to ``out_dir``, plus ``extra_files`` (name -> text). Never pickle: a
    ``.bin``/``.pkl``/``.pt`` file in the result is an error.

    Atomic: everything goes to a temporary folder beside ``out_dir`` which is then renamed
    to ``out_dir``, so a crash never leaves a half-written checkpoint under that name. An
    existing ``out_dir`` is replaced (moved aside, then deleted once the new one is in
    place). Returns ``out_dir`` as a ``Path``.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_dir(out, "tmp")
    try:
        kwargs: dict[str, Any] = {}
        if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers 4; transformers 5 always writes safetensors
        model.save_pretrained(tmp, **kwargs)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        pickled = sorted(p.name for p in tmp.rglob("*") if p.suffix in _PICKLE_SUFFIXES)
        if pickled:
            raise RuntimeError(f"pickle files were written to {out} ({pickled}); refusing to keep them")
        if not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"no safetensors file was written to {out}")
        old = None
        if out.exists():
            old = fresh_dir(out, "old")
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: PathLike) -> Path:
    """Write a checkpoint folder that :func:`load_policy` (or any transformers code) loads:
    weights as safetensors, config, generation config and tokenizer files, atomically
    (:func:`save_checkpoint`). Returns ``out_dir`` as a ``Path``."""
    return save_checkpoint(model, tokenizer, out_dir)


def save_trainable_state(model: torch.nn.Module, path: PathLike) -> Path:
    """Write the parameters of ``model`` that train (all of them in full fine-tuning, the adapter's
    with LoRA) to one safetensors file, atomically, on the CPU. Cheaper than a checkpoint folder
    (no optimiser, no tokenizer) and enough to put the weights of one moment back into the same
    model later (:func:`load_trainable_state`), e.g. the dev-best step of an RL run."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters() if p.requires_grad}
    if not state:
        raise ValueError("the model has no trainable parameter to save")
    fd, tmp = create_temp_beside(path)
    os.close(fd)
    try:
        save_file(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_trainable_state(model: torch.nn.Module, path: PathLike) -> int:
    """Copy the tensors of a :func:`save_trainable_state` file into ``model``'s parameters of the
    same names, in place (safetensors: nothing is unpickled); return how many were copied. A name
    the model lacks, a shape that differs, or a trainable parameter the file lacks is an error
    naming the file: the file was written by another model."""
    state = load_torch(path, remedy="restore it, or rerun what wrote it")
    params = dict(model.named_parameters())
    missing = sorted(n for n in state if n not in params)
    if missing:
        raise DataError(str(path), f"holds parameters this model lacks: {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    unsaved = sorted(n for n, p in params.items() if p.requires_grad and n not in state)
    if unsaved:
        raise DataError(str(path), f"lacks trainable parameters of this model: {unsaved[:3]}{' ...' if len(unsaved) > 3 else ''}")
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise DataError(str(path), f"{name} has shape {tuple(tensor.shape)}, the model's is {tuple(params[name].shape)}")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    return len(state)
