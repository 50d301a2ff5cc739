"""The extension recipes of docs/ARCHITECTURE.md, as printed there: each Python block is saved as the
module its first line names, loaded as a plugin by the real command in a fresh process, and the
command then knows the new name (in its `--help`, or by running it). A recipe that drifts from the
API fails here; tests/extensions/ runs the same three kinds of extension through whole commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "ARCHITECTURE.md"


def recipes(text: str) -> dict[str, str]:
    """Module name -> source, for every ```python block whose first line is ``# NAME.py``."""
    out: dict[str, str] = {}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        first = block.splitlines()[0].strip()
        if m := re.fullmatch(r"#\s*([A-Za-z_]\w*)\.py", first):
            out[m.group(1)] = block
    return out


def prorag(args: list[str], plugins: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)]), "PRORAG_PLUGINS": ",".join(plugins)}
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    return subprocess.run(
        [sys.executable, "-m", "prorag.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_page_has_the_three_recipes() -> None:
    assert sorted(recipes(PAGE.read_text(encoding="utf-8"))) == ["my_baselines", "my_rewards", "quiz_format"]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    for name, source in recipes(PAGE.read_text(encoding="utf-8")).items():
        (folder / f"{name}.py").write_text(source, encoding="utf-8")
    return folder


def test_the_process_reward_recipe_registers_its_name_and_its_settings(user_dir: Path) -> None:
    done = prorag(["rl", "--help"], ["my_rewards"], user_dir)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "wellformed" in text and "wellformed.penalty" in text


def test_the_baseline_recipe_registers_its_name(user_dir: Path) -> None:
    done = prorag(["eval", "--help"], ["my_baselines"], user_dir)
    assert done.returncode == 0, done.stderr
    assert "question-twice" in " ".join(done.stdout.split())


def test_the_data_format_recipe_converts_a_file(user_dir: Path) -> None:
    items = [{"qid": 1, "ask": "Who?", "replies": "Ada|Ada Lovelace"}, {"qid": 2, "ask": "Why?", "replies": " "}]
    (user_dir / "quiz.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    out = user_dir / "records.jsonl"
    done = prorag(["data", "convert", "quiz.jsonl", "--format", "quiz", "--out", str(out)], ["quiz_format"], user_dir)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["golden_answers"]) for r in rows] == [("1", ["Ada", "Ada Lovelace"])]
