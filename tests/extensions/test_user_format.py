"""A user's data format, as a user would add one: a module outside the package that registers it,
loaded by the real command (``PRORAG_PLUGINS`` or ``prorag --plugin``) in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: The user's plugin: a quiz format, ``{"qid", "ask", "replies": "a|b"}``, an item without replies skipped.
PLUGIN = """
from prorag.data.formats import DataFormat, register_format
from prorag.data.records import Record


def read_quiz(item, where, source):
    replies = [r.strip() for r in item["replies"].split("|") if r.strip()]
    if not replies:
        return "no replies"
    return Record(str(item["qid"]), item["ask"], replies, {"source": source, "quiz": True})


register_format(DataFormat("toy", expected_fields=("qid", "ask", "replies"), records=read_quiz, identified_by=("qid", "ask")))
"""


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """The user's folder: the plugin module and a tiny file in its format."""
    (tmp_path / "quiz_format.py").write_text(PLUGIN, encoding="utf-8")
    items = [{"qid": 7, "ask": "Who wrote it?", "replies": "Ada | Ada Lovelace"}, {"qid": 8, "ask": "Why?", "replies": " "}]
    (tmp_path / "quiz.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return tmp_path


def prorag(user_dir: Path, *args: str, plugins: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m prorag.cli ARGS`` in a fresh process, the user's folder on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PRORAG_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(user_dir), str(REPO)])
    if plugins:
        env["PRORAG_PLUGINS"] = plugins
    return subprocess.run(
        [sys.executable, "-m", "prorag.cli", *args], cwd=user_dir, env=env, capture_output=True, text=True, timeout=120
    )


def test_user_format_through_the_env_var(user_dir: Path) -> None:
    out = user_dir / "records.jsonl"
    done = prorag(user_dir, "data", "convert", "quiz.jsonl", "--format", "toy", "--out", str(out), plugins="quiz_format")
    assert done.returncode == 0, done.stderr
    assert "wrote 1 records" in done.stdout and "skipped: 1 no replies" in done.stdout
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records == [
        {
            "id": "7",
            "question": "Who wrote it?",
            "golden_answers": ["Ada", "Ada Lovelace"],
            "metadata": {"source": "toy", "quiz": True},
        }
    ]


def test_user_format_through_the_plugin_option(user_dir: Path) -> None:
    shown = prorag(user_dir, "--plugin", "quiz_format", "data", "convert", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "2wiki, flashrag, hotpotqa, musique, toy" in " ".join(shown.stdout.split())
    out = user_dir / "records.jsonl"
    done = prorag(user_dir, "--plugin", "quiz_format", "data", "convert", "quiz.jsonl", "-f", "toy", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines()] == ["7"]


def test_unknown_names_without_or_with_the_plugin(user_dir: Path) -> None:
    out = user_dir / "records.jsonl"
    missing = prorag(user_dir, "data", "convert", "quiz.jsonl", "-f", "toy", "-o", str(out))
    assert missing.returncode == 2 and "error: unknown data format 'toy'" in missing.stderr
    typo = prorag(user_dir, "data", "convert", "quiz.jsonl", "-f", "toyy", "-o", str(out), plugins="quiz_format")
    assert typo.returncode == 2 and "did you mean 'toy'?" in typo.stderr
    broken = prorag(user_dir, "--plugin", "quiz_fromat", "data", "convert", "quiz.jsonl", "-f", "toy", "-o", str(out))
    assert broken.returncode == 2
    assert (
        broken.stderr.strip()
        == "error: plugin 'quiz_fromat' (from --plugin) failed to load: ModuleNotFoundError: No module named 'quiz_fromat'"
    )
    assert not out.exists()
