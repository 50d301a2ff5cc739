"""docs/RESULTS.md is what the committed results give, cites every file results/ keeps, and links LOG
entries that exist; the script's pooling, power and page-filling pieces checked on numbers worked by hand."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from research.analysis.meta_analysis import random_effects, study_estimate
from research.drivers import results_page
from research.drivers.results_page import cell, detectable, fill, heading_anchors, seeds_for

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "RESULTS.md"


@pytest.fixture(scope="module")
def page() -> dict:
    return results_page.compute()


def test_the_page_is_what_the_results_files_give(page: dict) -> None:
    text = PAGE.read_text()
    assert fill(text, results_page.fragments(page)) == text, "run python research/drivers/results_page.py"


def test_the_pools_repeat_the_logs(page: dict) -> None:
    """Two pools the LOG quoted (2026-11-27 pooling; 2026-11-28 build 8, night) come out of the same files."""
    rows = {(r["name"], r["group"]): r["cells"] for r in page["summary"]}
    oracle = rows[("Oracle, up to the first error", results_page.DUAL)]["grpo_last"]
    assert (oracle["k"], oracle["mean"], oracle["ci"]) == (
        6,
        pytest.approx(0.48, abs=0.005),
        pytest.approx([-1.18, 2.14], abs=0.005),
    )
    prm_first_error = rows[("Learned PRM, up to its first error", results_page.SIGNED)]["control_last"]
    assert prm_first_error["ci"] == pytest.approx([-3.46, 7.62], abs=0.005)
    # build 8 at the dev-chosen step has no spread (pi_rft in every run): shown, not weighed
    dev = rows[("Learned PRM, up to its first error", results_page.SIGNED)]["control_dev"]
    assert [s["flat"] for s in dev["studies"]] == [False, False, True] and dev["k"] == 2


def test_the_opening_paragraph_quotes_the_counts(page: dict) -> None:
    opening = PAGE.read_text().split("## Definitions")[0]
    c = page["contrasts"]["counts"]["step rewards"]
    assert f"Of {c['tests']} tests of step-reward contrasts,\n{c['nominal_below_005']} had p < 0.05" in opening
    assert f"after Holm's correction {c['holm_below_005']} remain" in opening and c["holm_below_005_over_seeds"] == 0


def test_results_keeps_only_the_files_the_docs_cite() -> None:
    """results/ holds what RESULTS.md and BENCHMARKS.md cite; the rest lives in research/results/."""
    pages = PAGE.read_text() + (ROOT / "docs" / "BENCHMARKS.md").read_text()
    cited = set(re.findall(r"(?<![\w/])results/([\w.\-]+\.(?:json|png))", pages))
    kept = {p.name for p in (ROOT / "results").iterdir()}
    assert cited == kept


def test_every_log_link_names_a_log_heading() -> None:
    anchors = heading_anchors((ROOT / "docs" / "LOG.md").read_text())
    links = re.findall(r"LOG\.md#([\w\-]+)", PAGE.read_text())
    assert links and [link for link in links if link not in anchors] == []


def test_heading_anchors_are_python_markdowns_toc_ids() -> None:
    markdown = pytest.importorskip("markdown")
    text = "# A `code` *and* caf\u00e9 \u2014 +0.39 yes/no\n\n## A `code` and caf\u00e9 +039 yesno\n\n```\n# not a heading\n```\n"
    md = markdown.Markdown(extensions=["toc", "fenced_code"])  # as MkDocs configures it
    md.convert(text)
    ids = {token["id"] for token in md.toc_tokens} | {child["id"] for token in md.toc_tokens for child in token["children"]}
    assert heading_anchors(text) == ids == {"a-code-and-cafe-039-yesno", "a-code-and-cafe-039-yesno_1"}


def _record(study: str, diffs: list[float]) -> dict:
    return {
        "study": study,
        "source": "x",
        "arm": "a",
        "reference": "b",
        "arm_values": diffs,
        "reference_values": [0.0] * len(diffs),
    }


def test_a_cell_pools_its_studies_and_shows_a_lone_one_as_it_is() -> None:
    a, b, flat = [0.01, 0.03, 0.02], [0.05, 0.02, 0.04, 0.03], [0.0, 0.0, 0.0]
    pooled = cell([_record("a", a), _record("b", b), _record("flat", flat)])
    expected = random_effects([study_estimate("a", a), study_estimate("b", b)])
    assert pooled["method"] == "random effects" and (pooled["k"], pooled["seeds"]) == (2, 7)
    assert pooled["mean"] == pytest.approx(100 * expected.mean, abs=1e-3)
    assert pooled["p"] == pytest.approx(expected.p_value)
    lone = cell([_record("a", a)])
    assert lone["method"] == "one study" and lone["mean"] == pytest.approx(2.0)
    assert lone["ci"][1] - 2.0 == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-4)  # t(2 df) * sd / sqrt(n), points
    assert cell([]) is None


def test_detectable_difference_by_hand() -> None:
    # With many degrees of freedom the noncentral t is normal: z(0.975) + z(0.8) = 1.960 + 0.842 standard errors.
    assert detectable(1.0, 10_000) == pytest.approx(2.802, abs=0.01)
    # Fewer degrees of freedom need a larger difference; more seeds a smaller one.
    assert detectable(1.0, 4) > detectable(1.0, 6) > 2.802
    n = seeds_for(2.3, 2.2)
    assert detectable(2.3 / math.sqrt(n), n - 1) <= 2.2 < detectable(2.3 / math.sqrt(n - 1), n - 2)


def test_fill_rewrites_named_blocks_and_refuses_a_missing_one() -> None:
    text = "a\n<!-- generated: x -->\nold\n<!-- end: x -->\nb\n"
    assert fill(text, {"x": "new"}) == "a\n<!-- generated: x -->\nnew\n<!-- end: x -->\nb\n"
    with pytest.raises(ValueError, match="generated blocks"):
        fill(text, {"x": "new", "y": "other"})


def test_forest_plot_is_drawn(page: dict, tmp_path: Path) -> None:
    out = tmp_path / "forest.png"
    results_page.forest(page["summary"], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
