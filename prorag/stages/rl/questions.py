"""Which questions the RL stage trains on, and the key their screening rows are kept under.

``train_file`` minus ``exclude_ids_from``, then ``limit``. Keep RL questions disjoint from SFT's: a
question the policy was trained to answer gives an all-correct group, which outcome GRPO learns
nothing from. A screening row (``question_filter``) is reused only under the same key: the policy's
weights, the seed, G and the rollout settings (:func:`screening_key`), or a key an earlier version
gave the same settings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prorag.core.config import earlier_forms
from prorag.data.jsonl import read_jsonl
from prorag.data.records import Record
from prorag.stages.rl.config import RLConfig


def excluded_ids(paths: Sequence[str | Path]) -> set[str]:
    """The question ids of JSONL files: each row's ``question_id`` if it has one, else its ``id``."""
    out: set[str] = set()
    for path in paths:
        for row in read_jsonl(path):
            qid = row.get("question_id", row.get("id"))
            if qid is not None:
                out.add(str(qid))
    return out


def rl_records(records: Sequence[Record], exclude: set[str], limit: int | None = None) -> list[Record]:
    """The RL questions: ``records`` minus the ids in ``exclude``, then the first ``limit``."""
    kept = [r for r in records if r.id not in exclude]
    return kept[:limit] if limit is not None else kept


def screening_strata(records: Sequence[Record], field: str) -> list[str]:
    """Each record's ``metadata[field]`` as a stratum label (``(none)`` where it has none); a
    field that no record has is a typo, not a stratum, and is refused."""
    if not any(field in r.metadata for r in records):
        raise ValueError(f"RLConfig.screening_strata: no RL question has metadata field {field!r}")
    return [str(r.metadata.get(field, "(none)")) for r in records]


def screening_key(config: RLConfig) -> str:
    """What a screening row was sampled under: the policy, the seed, G and the rollout settings
    (a digest), so that a shared ``screening_file`` never serves rows of another policy or setting.

    The policy counts by its weights (:func:`~prorag.models.checkpoints.weights_digest`), not its
    path: a policy retrained in place must be screened again, and one policy reached by a relative
    and an absolute path (a probe and the pipeline) shares its rows. A hub id counts by its name
    (and a model handed to :func:`train_rl` in memory, with no ``policy``, as ``None``)."""
    return screening_keys(config)[0]


def screening_keys(config: RLConfig) -> list[str]:
    """:func:`screening_key`, then the keys that earlier versions gave the same settings (before a
    rollout setting of :data:`~prorag.core.config.LATER_FIELDS` existed): rows written under any of
    them were sampled as these settings sample, and are reused rather than screened again."""
    from prorag.models.checkpoints import resolve_policy_path, weights_digest

    policy = resolve_policy_path(config.policy) if config.policy is not None else None
    weights = weights_digest(policy) if policy is not None else None
    # Screening samples on the hf backend whatever `rollout.backend` says (train_rl): the backend and its
    # vLLM block change nothing it samples, so they stay out of the key (which stays the one earlier versions wrote).
    rollout = {k: v for k, v in asdict(config.rollout).items() if k not in ("backend", "vllm")}
    keys: list[str] = []
    for form in [rollout, *earlier_forms(rollout)]:
        what = {"policy": weights or policy, "seed": config.seed, "group_size": config.group_size, "rollout": form}
        key = hashlib.blake2b(json.dumps(what, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
        if key not in keys:
            keys.append(key)
    return keys


def rl_dataset(records: Sequence[Record]) -> Any:
    """TRL's training dataset: one row per question, ``prompt`` (the question, which TRL logs and
    hands to ``rollout_func``), ``record_index`` (the row's record, for :class:`EngineRollout`
    and the advantage groups) and ``golden_answers`` (for the outcome reward)."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": r.question, "record_index": i, "golden_answers": list(r.golden_answers)} for i, r in enumerate(records)]
    )


__all__ = [
    "excluded_ids",
    "rl_dataset",
    "rl_records",
    "screening_key",
    "screening_keys",
    "screening_strata",
]
