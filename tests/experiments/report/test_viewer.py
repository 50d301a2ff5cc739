"""The trajectory viewer: steps from the schema's parser paired with their PRM scores, the score
colours, and one browser test in headless Chromium (slow)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prorag.agent.schema import Action, ActionKind, render_trajectory
from prorag.data.jsonl import read_jsonl
from prorag.experiments.report.viewer import load_questions, score_colour, sigmoid, trajectory_steps
from tests.experiments.report.hand_run import HOSTILE, hand_trajectory

log = logging.getLogger(__name__)


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
    traj = hand_trajectory("q", "Q?", actions)
    steps = trajectory_steps(traj, [1.0, -2.0, 0.5])
    assert [s.kind for s in steps] == ["search", "conclude", "answer"]
    assert [(s.thought, s.content) for s in steps] == [("find A", "A?"), ("A is known", "a"), ("done", "a")]
    assert steps[0].documents == ("Doc 1(Title: A) first", "Doc 2(Title: B) second") and steps[0].doc_ids == ("q-d0",)
    assert [s.logit for s in steps] == [1.0, -2.0, 0.5]
    # A truncated completion: the cut action is malformed; scores that do not line up are dropped.
    cut = hand_trajectory("q", "Q?", actions[:1], text=render_trajectory(actions[:1]) + "\n<step> thinking but cut")
    steps = trajectory_steps(cut, [1.0])
    assert [s.kind for s in steps] == ["search", "malformed"] and not steps[1].well_formed
    assert [s.logit for s in steps] == [None, None]


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
