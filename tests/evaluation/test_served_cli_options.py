"""``prorag eval --generator served`` as a user types it (issue 70): ``--api-key-env none`` means no
key, and one setting of the served block is given with a dotted ``--set``, not the whole block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from tests.fake_chat_server import FakeChatServer, Reply

runner = CliRunner()


def test_eval_served_with_api_key_env_none_and_a_dotted_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("none", raising=False)
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"id": "1", "question": "Who wrote it?", "golden_answers": ["Ada"]}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "a", "contents": "Ada\nAda wrote the first program."}) + "\n")
    assert runner.invoke(app, ["index", "-c", str(corpus), "-o", str(tmp_path / "idx")]).exit_code == 0
    out = tmp_path / "eval"
    with FakeChatServer(lambda body, n: Reply(content="Ada")) as server:
        result = runner.invoke(
            app,
            ["eval", "--data", str(records), "--index", str(tmp_path / "idx"), "--out", str(out), "--baseline", "naive",
             "--generator", "served", "--base-url", server.url, "--served-model", "m", "--api-key-env", "none",
             "--set", "generator.served.timeout_s=5", "--set", "generator.served.read_timeout_s=2"],
        )  # fmt: skip
        seen = list(server.seen)
    assert result.exit_code == 0, result.output
    assert seen and all("Authorization" not in s.headers for s in seen)
    config = json.loads((out / "metrics.json").read_text())["config"]["generator"]["served"]
    assert (config["api_key_env"], config["timeout_s"], config["read_timeout_s"]) == ("none", 5, 2)
    assert [json.loads(line)["prediction"] for line in (out / "predictions.jsonl").read_text().splitlines()] == ["Ada"]

    # A reply over max_reply_bytes stops the run with one line naming the endpoint, asked once.
    with FakeChatServer(lambda body, n: Reply(content="Ada " * 5000, chunked=True)) as server:
        result = runner.invoke(
            app,
            ["eval", "--data", str(records), "--index", str(tmp_path / "idx"), "--out", str(tmp_path / "huge"),
             "--baseline", "naive", "--generator", "served", "--base-url", server.url, "--served-model", "m",
             "--set", "generator.served.max_reply_bytes=4096"],
        )  # fmt: skip
        asked = server.n_requests
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and asked == 1, result.output
    assert lines[-1].startswith(f"error: {server.url}/completions: the reply grew past max_reply_bytes (4096)"), lines
