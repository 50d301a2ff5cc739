"""The run report: step scores of evaluation trajectories, the tables (measured numbers, named
metrics), the plots, a self-contained HTML page that escapes model output, and one browser test
of the trajectory viewer in headless Chromium."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import ActionRecord, RolloutEngine, Trajectory
from prorag.agent.schema import Action, ActionKind, render_trajectory
from prorag.data.jsonl import read_jsonl, write_json, write_jsonl
from prorag.data.records import Record, read_records
from prorag.evaluation.harness import EvalConfig, EvalRolloutConfig, evaluate, score, summarise
from prorag.experiments.report import (
    ReportConfig,
    curves_by_system,
    load_questions,
    moving_average,
    reference_system,
    score_colour,
    score_eval_trajectories,
    seed_band,
    sigmoid,
    trajectory_steps,
    write_report,
)
from prorag.retrieval.bm25 import BM25Retriever
from tests.fakes import ReplayLM

log = logging.getLogger(__name__)

#: A thought written by an adversarial model: it must reach the page as text, never as markup.
HOSTILE = '<script>alert("pwned")</script> & <img src=x onerror=alert(1)>'


class KindScorer:
    """A fake PRM: the logit of an action depends on its kind and position (hand-checkable)."""

    LOGIT = {"search": 2.0, "conclude": 0.5, "answer": -1.0, None: -3.0}

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        self.calls.append(len(trajectories))
        return [[self.LOGIT[a.kind] + 0.25 * i for i, a in enumerate(t.actions)] for t in trajectories]


def _hand_trajectory(qid: str, question: str, actions: list[Action], text: str | None = None) -> Trajectory:
    """A trajectory written by hand: text from the schema's renderer, token spans that only count actions."""
    text = render_trajectory(actions) if text is None else text
    records = [ActionRecord(a.kind.value if a.kind else None, (2 * i, 2 * i + 1), True) for i, a in enumerate(actions)]
    searches = [
        {"query": a.content, "doc_ids": [f"{qid}-d{i}"], "action": i}
        for i, a in enumerate(actions)
        if a.kind is ActionKind.SEARCH
    ]
    return Trajectory(
        id=qid,
        question=question,
        prompt_ids=[1, 2],
        completion_ids=list(range(2 * len(actions))),
        env_mask=[1] * (2 * len(actions)),
        logprobs=[0.0] * (2 * len(actions)),
        actions=records,
        retrievals=searches,
        stop_reason="answer",
        text=text,
        answer=actions[-1].content if actions and actions[-1].kind is ActionKind.ANSWER else None,
        valid=True,
    )


def _hand_system(eval_dir: Path, records: list[Record]) -> dict[str, Any]:
    """A second system with hand-written trajectories: one wrong answer with a hostile thought, one
    right answer; predictions scored by the evaluation harness's own ``score``."""
    r0, r1 = records[0], records[1]
    t0 = _hand_trajectory(
        r0.id,
        r0.question,
        [
            Action(
                ActionKind.SEARCH,
                HOSTILE,
                "who <b>is</b> it",
                retrieval="Doc 1(Title: Alpha) alpha text\nDoc 2(Title: Beta) b < c",
            ),
            Action(ActionKind.ANSWER, "so it is", "Nobody"),
        ],
    )
    t1 = _hand_trajectory(r1.id, r1.question, [Action(ActionKind.ANSWER, "I know it", r1.golden_answers[0])])
    preds = [score(r, t, t.answer) for r, t in ((r0, t0), (r1, t1))]
    write_jsonl(eval_dir / "trajectories.jsonl", [t0.to_dict(), t1.to_dict()])
    write_jsonl(eval_dir / "predictions.jsonl", preds)
    metrics = summarise(preds)
    write_json(eval_dir / "metrics.json", metrics)
    return metrics


@pytest.fixture(scope="module")
def run_dir(
    tmp_path_factory: pytest.TempPathFactory, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> Path:
    """A pipeline run folder (contract 5) with three systems:

    * ``prorag``: evaluated by the real harness with a policy that replays gold trajectories,
      step scores from a fake PRM;
    * ``grpo``: hand-written trajectories (one hostile), two seeds and a t-test against prorag;
    * ``naive``: metrics only, no evaluation folder.
    """
    run = tmp_path_factory.mktemp("run")
    records = read_records(tiny_world / "test.jsonl")[:6]
    golds = render_gold(records, tiny_retriever, k=3)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    model = ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    cfg = EvalConfig(rollout=EvalRolloutConfig(batch_size=6))
    full = evaluate(model, world_tokenizer, records, tiny_retriever, run / "eval" / "prorag", cfg, progress=False)
    score_eval_trajectories(KindScorer(), run / "eval" / "prorag", batch_size=4)
    grpo = _hand_system(run / "eval" / "grpo", records)
    naive = {"em": 0.125, "f1": 0.25, "format_valid_rate": 1.0, "mean_retrieval_steps": 0.0, "n": 6}
    write_jsonl(
        run / "rl" / "prorag" / "metrics.jsonl",
        [{"step": s, "outcome_reward": 0.1 * s} for s in range(1, 6)] + [{"train_runtime": 3.0}],
    )
    write_jsonl(run / "rl" / "grpo" / "metrics.jsonl", [{"step": s, "outcome_reward": 0.05 * s} for s in range(1, 6)])
    results = {
        "systems": {
            "naive": {"label": "Naive generation", "metrics": naive},
            "grpo": {
                "label": "GRPO baseline",
                "eval_dir": "eval/grpo",
                "metrics": grpo,
                "seeds": {"0": grpo | {"em": 0.2}, "1": grpo | {"em": 0.4}},
                "per_question": "eval/grpo/predictions.jsonl",
            },
            "prorag": {
                "label": "ProRAG (full)",
                "eval_dir": "eval/prorag",
                "metrics": full,
                "per_question": "eval/prorag/predictions.jsonl",
            },
        },
        "order": ["naive", "grpo", "prorag"],
        "curves": {"prorag": "rl/prorag/metrics.jsonl", "grpo": "rl/grpo/metrics.jsonl", "missing": "rl/none/metrics.jsonl"},
        "beta_sweep": {"0.0": {"em": 0.3, "f1": 0.4, "em_std": 0.05, "f1_std": 0.02}, "0.3": {"em": 0.5, "f1": 0.6}},
        "significance": {"grpo": {"metric": "em", "t": -2.5, "p_value": 0.0412, "n": 6}},
        "wall_seconds": {"sft": 12.5, "rl": 125.0},
        "world": {"test_questions": 6, "passages": 42},
    }
    write_json(run / "results.json", results)
    write_report(run)
    return run


def _md_row(md: str, label: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


# ----------------------------------------------------------------------------- step scores


def test_score_eval_trajectories_writes_one_logit_per_action(tmp_path: Path, tiny_world: Path) -> None:
    records = read_records(tiny_world / "test.jsonl")[:3]
    trajs = [
        _hand_trajectory(
            records[0].id,
            "q0",
            [Action(ActionKind.SEARCH, "t", "q", retrieval="Doc 1(Title: A) a"), Action(ActionKind.ANSWER, "t", "x")],
        ),
        _hand_trajectory(records[1].id, "q1", [Action(ActionKind.ANSWER, "t", "y")]),
        _hand_trajectory(records[2].id, "q2", [Action(ActionKind.CONCLUDE, "t", "c"), Action(ActionKind.ANSWER, "t", "z")]),
    ]
    write_jsonl(tmp_path / "trajectories.jsonl", [t.to_dict() for t in trajs])
    scorer = KindScorer()
    out = score_eval_trajectories(scorer, tmp_path, batch_size=2)
    assert out == tmp_path / "step_scores.jsonl"
    rows = list(read_jsonl(out))
    assert [r["id"] for r in rows] == [t.id for t in trajs]
    assert [r["logits"] for r in rows] == [[2.0, -0.75], [-1.0], [0.5, -0.75]]  # kind logit + 0.25 * position
    assert scorer.calls == [2, 1], "batches of batch_size trajectories"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left"


def test_score_eval_trajectories_refuses_a_scorer_that_drops_actions(tmp_path: Path) -> None:
    traj = _hand_trajectory("q", "q", [Action(ActionKind.CONCLUDE, "t", "c"), Action(ActionKind.ANSWER, "t", "a")])
    write_jsonl(tmp_path / "trajectories.jsonl", [traj.to_dict()])

    class Short:
        def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
            return [[0.0] for _ in trajectories]

    with pytest.raises(ValueError, match="1 logits for the 2 actions"):
        score_eval_trajectories(Short(), tmp_path)
    assert not (tmp_path / "step_scores.jsonl").exists()


# ----------------------------------------------------------------------------- pure pieces


def test_sigmoid_and_colour_run_red_to_green() -> None:
    assert sigmoid(0.0) == 0.5 and sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0
    assert sigmoid(2.0) == pytest.approx(0.8807970779778823)
    assert score_colour(0.0) == "hsl(60, 75%, 82%)"  # yellow: the PRM is undecided
    assert score_colour(-50.0) == "hsl(0, 75%, 82%)" and score_colour(50.0) == "hsl(120, 75%, 82%)"


def test_trajectory_steps_come_from_the_schema_parser() -> None:
    actions = [
        Action(ActionKind.SEARCH, "find A", "A?", retrieval="Doc 1(Title: A) first\nDoc 2(Title: B) second"),
        Action(ActionKind.CONCLUDE, "A is known", "a"),
        Action(ActionKind.ANSWER, "done", "a"),
    ]
    traj = _hand_trajectory("q", "Q?", actions)
    steps = trajectory_steps(traj, [1.0, -2.0, 0.5])
    assert [s.kind for s in steps] == ["search", "conclude", "answer"]
    assert [(s.thought, s.content) for s in steps] == [("find A", "A?"), ("A is known", "a"), ("done", "a")]
    assert steps[0].documents == ("Doc 1(Title: A) first", "Doc 2(Title: B) second") and steps[0].doc_ids == ("q-d0",)
    assert [s.logit for s in steps] == [1.0, -2.0, 0.5]
    # A truncated completion: the cut action is malformed; scores that do not line up are dropped.
    cut = _hand_trajectory("q", "Q?", actions[:1], text=render_trajectory(actions[:1]) + "\n<step> thinking but cut")
    steps = trajectory_steps(cut, [1.0])
    assert [s.kind for s in steps] == ["search", "malformed"] and not steps[1].well_formed
    assert [s.logit for s in steps] == [None, None]


def test_learning_curves_average_seeds_and_smooth() -> None:
    curves = {
        "grpo-seed0": [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)],
        "grpo-seed1": [(1.0, 3.0), (2.0, 0.0)],  # cut short: the band stops at step 2
        "prorag-seed0": [(1.0, 5.0)],
        "extra": [(1.0, 7.0)],
    }
    named = {"grpo": ["grpo-seed0", "grpo-seed1"], "prorag": ["prorag-seed0", "prorag-seed1"], "rl-from-sft": ["x"]}
    groups = curves_by_system(curves, named)
    assert list(groups) == ["grpo", "prorag", "extra"]
    assert [len(v) for v in groups.values()] == [2, 1, 1]
    assert seed_band(groups["grpo"]) == [(1.0, 2.0, 1.0, 3.0), (2.0, 1.0, 0.0, 2.0)]
    assert seed_band([]) == []
    # trailing mean over 2: 1, (1+3)/2, (3+5)/2, (5+7)/2
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([1.0, 3.0], 5) == [1.0, 2.0]
    with pytest.raises(ValueError, match="window"):
        moving_average([1.0], 0)


def test_reference_system_rule() -> None:
    systems = {"a": {"label": "SFT"}, "b": {"label": "ProRAG (full)"}}
    assert reference_system({"systems": systems, "order": ["a", "b"]}) == "b"
    assert reference_system({"systems": systems, "order": ["a", "b"], "reference": "a"}) == "a"
    assert reference_system({"systems": systems | {"prorag": {}}, "order": ["a", "b", "prorag"]}) == "prorag"


# ----------------------------------------------------------------------------- the report


def test_markdown_table_holds_the_measured_numbers(run_dir: Path) -> None:
    md = (run_dir / "report.md").read_text()
    full = json.loads((run_dir / "eval" / "prorag" / "metrics.json").read_text())
    row = _md_row(md, "ProRAG (full)")
    assert row[1:5] == [
        f"{100 * full['em']:.1f}",
        f"{100 * full['f1']:.1f}",
        f"{100 * full['format_valid_rate']:.1f}",
        f"{full['mean_retrieval_steps']:.2f}",
    ]
    assert row[-1] == "reference"
    # Two seeds with EM 0.2 and 0.4: mean 30.0, sample std 14.1 (hand-computed).
    grpo = _md_row(md, "GRPO baseline")
    assert grpo[1] == "30.0 ± 14.1" and grpo[5] == "2"
    assert grpo[-1] == "p=0.041 (EM, n=6)", "a p-value names the metric it tested"
    assert _md_row(md, "Naive generation")[1:3] == ["12.5", "25.0"]
    assert "normalised exact match" in md and "containment" not in md.lower()
    assert "| 0.3 | 50.0 | 60.0 |" in md and "| 0 | 30.0 ± 5.0 | 40.0 ± 2.0 |" in md  # beta sweep
    assert "| rl | 2 min 5 s |" in md and "| passages | 42 |" in md
    dist = full["retrieval_steps_distribution"][0]
    assert f"| ProRAG (full) | {dist['steps']} | {dist['count']} | {100 * dist['coverage']:.1f} |" in md


def test_plots_exist_and_missing_parts_are_left_out(run_dir: Path) -> None:
    names = sorted(p.name for p in (run_dir / "plots").iterdir())
    assert names == ["beta.png", "learning_curves.png", "results.png", "retrieval_steps.png"]  # no top-k sweep in this run
    for name in names:
        assert (run_dir / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_is_self_contained_and_escapes_model_output(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I), "no external resource"
    assert "<link" not in page and not re.search(r"<script[^>]+src", page)
    assert page.count('src="data:image/png;base64,') == 4
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "who &lt;b&gt;is&lt;/b&gt; it" in page and "b &lt; c" in page


def test_viewer_pairs_steps_with_their_scores(run_dir: Path) -> None:
    questions = load_questions(run_dir / "eval" / "prorag")
    scores = {r["id"]: r["logits"] for r in read_jsonl(run_dir / "eval" / "prorag" / "step_scores.jsonl")}
    assert len(questions) == 6
    for q in questions:
        assert q.em == 1.0 and q.prediction in q.golden_answers
        assert [s.logit for s in q.steps] == scores[q.id]
        assert [s.kind for s in q.steps][-1] == "answer"
        searches = [s for s in q.steps if s.kind == "search"]
        assert searches and all(len(s.documents) == 3 and len(s.doc_ids) == 3 for s in searches)
    page = (run_dir / "report.html").read_text()
    first = questions[0].steps[0]
    assert f"PRM {first.logit:+.2f} (σ {sigmoid(first.logit):.2f})" in page
    assert "PRM: not scored" in page, "the hand-written system has no step scores"


def test_minimal_run_without_optional_parts(tmp_path: Path) -> None:
    metrics = {"em": 0.5, "f1": 0.625, "format_valid_rate": 0.75, "mean_retrieval_steps": 1.5, "n": 4}
    write_json(tmp_path / "results.json", {"systems": {"only": {"label": "Only", "metrics": metrics}}, "order": ["only"]})
    md_path, html_path = write_report(tmp_path, ReportConfig(viewer_limit=5))
    assert _md_row(md_path.read_text(), "Only")[1:5] == ["50.0", "62.5", "75.0", "1.50"]
    assert "no trajectories to show" in html_path.read_text()
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["results.png"]


def test_bad_results_file_names_the_field(tmp_path: Path) -> None:
    from prorag.core.errors import DataError

    write_json(tmp_path / "results.json", {"systems": {"a": {"metrics": {}}}, "order": ["a", "b"]})
    with pytest.raises(DataError, match="results.json: field 'order' names systems not in 'systems': b"):
        write_report(tmp_path)


def test_report_cli(run_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prorag.cli import app

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "report.md").unlink()
    result = CliRunner().invoke(app, ["report", "--run-dir", str(copy)])
    assert result.exit_code == 0, result.output
    assert (copy / "report.md").read_text() == (run_dir / "report.md").read_text()
    assert CliRunner().invoke(app, ["report", "--run-dir", str(tmp_path / "nowhere")]).exit_code == 2


# ----------------------------------------------------------------------------- the browser test


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cannot_run(reason: str) -> None:
    """No browser: a failure in CI (the check must run there), a skip with the reason elsewhere."""
    how = "install them with: sudo apt-get install -y chromium chromium-driver (Debian/Ubuntu), and pip install selenium"
    if _in_ci():
        pytest.fail(f"{reason}; {how}")
    pytest.skip(f"{reason}; {how}")


def _browser_paths() -> tuple[str | None, str | None]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
    return chromium, driver


@pytest.fixture(scope="session")
def chromium_paths() -> tuple[str, str]:
    """``(chromium, chromedriver)``, installing the Debian packages first when they are missing
    and this process may (root, apt-get available)."""
    chromium, driver = _browser_paths()
    if chromium and driver:
        return chromium, driver
    if not shutil.which("apt-get") or os.geteuid() != 0:
        _cannot_run("chromium and chromedriver are missing and cannot be installed here (needs root and apt-get)")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    start = time.perf_counter()
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "chromium-driver"],
    ):
        log.warning("installing the browser for the report test: %s", " ".join(cmd))
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(cmd)} did not finish in 900 s")
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    log.warning("installed chromium and chromium-driver in %.0f s", time.perf_counter() - start)
    chromium, driver = _browser_paths()
    if not (chromium and driver):
        pytest.fail(f"apt-get installed chromium and chromium-driver but found chromium={chromium}, chromedriver={driver}")
    return chromium, driver


@pytest.fixture
def browser(chromium_paths: tuple[str, str]) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _cannot_run("selenium is not installed (pip install -e '.[dev]')")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    # An explicit driver path: Selenium Manager would otherwise try to download one.
    driver = webdriver.Chrome(service=Service(executable_path=chromium_paths[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_viewer_in_headless_chromium(run_dir: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get((run_dir / "report.html").as_uri())
    assert "ProRAG run report" in browser.title
    full = browser.find_element(By.CSS_SELECTOR, '.viewer[data-system="prorag"]')
    grpo = browser.find_element(By.CSS_SELECTOR, '.viewer[data-system="grpo"]')
    assert full.is_displayed() and not grpo.is_displayed(), "full ProRAG is shown first"
    question = full.find_element(By.CSS_SELECTOR, "details.question")
    steps = question.find_elements(By.CSS_SELECTOR, "li.step")
    assert steps and not steps[0].is_displayed(), "steps are folded until the question is opened"
    question.find_element(By.TAG_NAME, "summary").click()
    assert all(s.is_displayed() for s in steps)
    expected = load_questions(run_dir / "eval" / "prorag")[0]
    shown = [s.find_element(By.CLASS_NAME, "step-score").text for s in steps]
    assert shown == [f"PRM {s.logit:+.2f} (σ {sigmoid(s.logit):.2f})" for s in expected.steps]
    # The colour is the sigmoid of the logit: the first step (a search, logit 2.0) is greenish.
    colour = steps[0].find_element(By.CLASS_NAME, "step-score").value_of_css_property("background-color")
    r, g, _ = (int(x) for x in re.findall(r"\d+", colour)[:3])
    assert g > r, colour
    docs = steps[0].find_element(By.CSS_SELECTOR, "details.docs")
    docs.find_element(By.TAG_NAME, "summary").click()
    assert len([li for li in docs.find_elements(By.CSS_SELECTOR, "ol li") if li.is_displayed()]) == 3
    assert expected.golden_answers[0] in question.find_element(By.CLASS_NAME, "answers").text
    # The selector switches to another system; its hostile thought is shown as text.
    Select(browser.find_element(By.ID, "system-select")).select_by_value("grpo")
    assert grpo.is_displayed() and not full.is_displayed()
    grpo.find_element(By.CSS_SELECTOR, "details.question summary").click()
    assert HOSTILE in grpo.find_element(By.CSS_SELECTOR, "li.step .thought").text
    assert browser.find_elements(By.CSS_SELECTOR, "img[src^='x']") == []
