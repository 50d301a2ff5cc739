"""The pipeline run folder the report reads (DESIGN.md contract 5): ``results.json`` names every
evaluated system (metrics, evaluation folder, per-seed metrics, a paired t-test against full
ProRAG), the learning-curve groups and the optional sweeps. Checked on load: a bad field is a
:class:`~prorag.core.errors.DataError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prorag.core.errors import DataError
from prorag.data.jsonl import read_json


def load_results(run_dir: Path) -> dict[str, Any]:
    """``RUN/results.json``, checked for the fields the report needs (``systems`` and ``order``)."""
    path = Path(run_dir) / "results.json"
    results = read_json(path)
    if not isinstance(results, dict):
        raise DataError(str(path), f"expected a JSON object, got {type(results).__name__}")
    systems = results.get("systems")
    if not isinstance(systems, dict):
        raise DataError(str(path), "field 'systems' must be an object {NAME: {label, eval_dir, metrics, ...}}")
    order = results.get("order") or list(systems)
    unknown = [name for name in order if name not in systems]
    if unknown:
        raise DataError(str(path), f"field 'order' names systems not in 'systems': {', '.join(unknown)}")
    for name in order:
        if not isinstance(systems[name].get("metrics"), dict):
            raise DataError(str(path), f"systems.{name}.metrics must be an object (the system's metrics.json)")
    return results | {"order": list(order)}


def reference_system(results: Mapping[str, Any]) -> str | None:
    """The full ProRAG system, which the p-values compare against and the viewer shows first.

    ``results["reference"]`` when the pipeline names it; else a system called ``prorag``; else
    the first system whose label starts with "ProRAG"; else the first system of the table.
    """
    systems, order = results["systems"], results["order"]
    if results.get("reference") in systems:
        return str(results["reference"])
    if "prorag" in systems:
        return "prorag"
    for name in order:
        if str(systems[name].get("label", "")).lower().startswith("prorag"):
            return name
    return order[0] if order else None


def eval_dir_of(run_dir: Path, system: Mapping[str, Any]) -> Path | None:
    """The evaluation folder of a system (relative paths are relative to the run folder)."""
    where = system.get("eval_dir")
    return None if not where else Path(run_dir) / where
