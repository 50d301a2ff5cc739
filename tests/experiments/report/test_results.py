"""The run folder: the reference system rule and a bad results file naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.data.jsonl import write_json
from prorag.experiments.report.build import write_report
from prorag.experiments.report.results import reference_system


def test_reference_system_rule() -> None:
    systems = {"a": {"label": "SFT"}, "b": {"label": "ProRAG (full)"}}
    assert reference_system({"systems": systems, "order": ["a", "b"]}) == "b"
    assert reference_system({"systems": systems, "order": ["a", "b"], "reference": "a"}) == "a"
    assert reference_system({"systems": systems | {"prorag": {}}, "order": ["a", "b", "prorag"]}) == "prorag"


def test_bad_results_file_names_the_field(tmp_path: Path) -> None:
    from prorag.core.errors import DataError

    write_json(tmp_path / "results.json", {"systems": {"a": {"metrics": {}}}, "order": ["a", "b"]})
    with pytest.raises(DataError, match="results.json: field 'order' names systems not in 'systems': b"):
        write_report(tmp_path)
