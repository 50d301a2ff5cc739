"""The run folder's bookkeeping: :class:`Run` runs a stage unless its marker says it already ran with these settings.

A finished stage writes ``RUN/stages/NAME.json`` with the fingerprint of its settings
(:func:`fingerprint`): a rerun skips matching stages, a killed stage resumes inside, and changed
settings for a finished stage are refused (use a new run folder), so a killed and rerun pipeline ends
with the files of an uninterrupted one. A fingerprint reads ``3`` and ``3.0`` alike (a YAML file and
Python code give the same setting) and paths inside the run folder relative to it, so a moved run
folder still matches its markers; markers of an earlier config layout (:data:`CONFIG_SCHEMA`) are refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from prorag.core.config import earlier_forms, used_settings
from prorag.data.jsonl import read_json, write_json
from prorag.experiments.pipeline.config import PipelineConfig, stage_device

#: Version of the stage configs' layout in the stage markers: 2 since the shared training fields,
#: LoRA and the engine's settings became nested configs (a fingerprint of layout 1 cannot match).
CONFIG_SCHEMA = 2


def _canonical(value: Any, roots: Sequence[str] = ()) -> Any:
    """Numbers as a YAML file and a Python literal give them: ``3.0`` (a float field read from
    ``epochs: 3``) and ``3`` (``epochs=3`` in code) are the same setting. A path inside one of
    ``roots`` (the run folder, as given and resolved) is written relative to it (``$RUN/...``),
    so a run folder that was moved or copied elsewhere still matches its own stage markers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        for root in roots:
            if value == root or value.startswith(root + os.sep):
                return "$RUN" + value[len(root) :]
        return value
    if isinstance(value, dict):
        return {k: _canonical(v, roots) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v, roots) for v in value]
    return value


def fingerprint(value: Any, root: Path | None = None) -> str:
    """A short stable hash of a config (dataclass or plain data) for the stage markers; the same
    settings give the same hash whether they came from code or from a YAML file, and (with
    ``root``, the run folder) wherever the run folder lies."""
    data = asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    roots = sorted({str(root), str(root.resolve())}, key=len, reverse=True) if root is not None else []
    text = json.dumps(_canonical(data, roots), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class Run:
    """A pipeline run: its folder, resolved config, and the stage bookkeeping."""

    dir: Path
    config: PipelineConfig
    progress: Callable[[str], None] = print
    wall: dict[str, float] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """Where MCTS, the PRM audit, RFT's sampling and the evaluations run
        (:func:`~prorag.experiments.pipeline.config.stage_device`)."""
        return stage_device(self.config.device)

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def stage(self, name: str, settings: Any, fn: Callable[[], Any]) -> None:
        """Run ``fn`` unless ``stages/NAME.json`` says it already ran with ``settings``."""
        marker = self.path("stages", f"{name}.json")
        used = used_settings(settings)
        key = fingerprint(used, root=self.dir)
        if marker.exists():
            done = read_json(marker)
            if done.get("config_schema", 1) < CONFIG_SCHEMA:
                raise ValueError(
                    f"stage {name!r} of {self.dir} was made by an earlier config layout ({marker} has config_schema "
                    f"{done.get('config_schema', 1)}, this version writes {CONFIG_SCHEMA}); use a new run folder, "
                    f"or delete {marker} and the stage's outputs to redo it"
                )
            # Markers written before fingerprints were relative to the run folder hash its absolute
            # paths: they still match while the folder has not moved; markers written before a
            # LATER_FIELDS setting existed match while it keeps its old-behaviour value, or at any
            # value while it sits in a method block the stage does not use (METHOD_BLOCKS).
            accepted = {key, fingerprint(used)}
            for earlier in earlier_forms(settings):
                accepted |= {fingerprint(earlier, root=self.dir), fingerprint(earlier)}
            if done.get("fingerprint") not in accepted:
                raise ValueError(
                    f"stage {name!r} of {self.dir} finished with other settings ({marker}); use a new run folder, "
                    f"or delete {marker} and the stage's outputs to redo it"
                )
            self.wall[name] = float(done.get("seconds", 0.0))
            self.progress(f"[skip] {name}: done ({done.get('seconds', 0):.0f}s)")
            return
        self.progress(f"[run ] {name}")
        if torch.cuda.is_available():
            # Hand the last stage's cached blocks back: rollouts leave tens of GB reserved in pieces
            # (slot pools, graph pools), and a later stage's one large block then fails to fit.
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        self.wall[name] = seconds
        write_json(marker, {"stage": name, "config_schema": CONFIG_SCHEMA, "fingerprint": key, "seconds": round(seconds, 2)})
        self.progress(f"[done] {name} in {seconds:.0f}s")


def rl_run_name(system: str, seed: int) -> str:
    return f"{system}-seed{seed}"


def eval_dir_name(system: str, seed: int | None) -> str:
    return system if seed is None else f"{system}-seed{seed}"
