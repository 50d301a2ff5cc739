"""Bad input through the real commands (issue 21): exit code 2 and one line naming the place,
nothing half written, and the traceback only with ``prorag -v``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.cli.options import error_line
from prorag.core.errors import DataError

runner = CliRunner()

BINARY = b"\xff\xfe\x00\x01binary"


def fails_with_one_line(args: list[str], expected: str) -> str:
    """Run ``prorag ARGS``; assert exit code 2 and a single output line containing ``expected``."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    return lines[0]


def write_lines(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "records.jsonl", [{"id": "1", "question": "Who?", "golden_answers": ["Ada"]}])


@pytest.fixture
def index(tmp_path: Path) -> Path:
    corpus = write_lines(
        tmp_path / "corpus.jsonl",
        [{"id": "a", "contents": "Ada\nAda wrote the first program."}, {"id": "b", "contents": "Bob\nBob ran."}],
    )
    out = tmp_path / "idx"
    assert runner.invoke(app, ["index", "-c", str(corpus), "-o", str(out)]).exit_code == 0
    return out


# ----------------------------------------------------------------------------- outputs in the wrong place


def test_convert_out_pointing_at_a_folder(records: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    fails_with_one_line(["data", "convert", str(records), "-f", "flashrag", "--out", str(folder)], f"{folder}: is a folder")
    assert list(folder.iterdir()) == [] and [p.name for p in tmp_path.glob(".*.tmp")] == []


def test_world_out_pointing_at_a_file(tmp_path: Path) -> None:
    existing = tmp_path / "exists.txt"
    existing.write_text("keep me")
    fails_with_one_line(["world", "--out", str(existing), "--size", "tiny"], f"{existing}: is a file; expected a folder")
    assert existing.read_text() == "keep me"


# ----------------------------------------------------------------------------- services and models that are not there


def test_retrieve_against_a_server_that_is_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    import prorag.retrieval.client as client

    monkeypatch.setattr(client.time, "sleep", lambda s: None)  # the retries' backoff
    fails_with_one_line(
        ["retrieve", "--index", "http://127.0.0.1:9", "q"], "retrieval server http://127.0.0.1:9/retrieve failed 4"
    )


def test_eval_with_a_policy_path_that_does_not_exist(records: Path, index: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "policy"
    args = ["eval", "--policy", str(missing), "--data", str(records), "-i", str(index), "--out", str(tmp_path / "ev")]
    fails_with_one_line(args, f"{missing}: no such policy folder")
    empty = tmp_path / "empty_policy"
    empty.mkdir()
    args = ["eval", "--policy", str(empty), "--data", str(records), "-i", str(index), "--out", str(tmp_path / "ev")]
    fails_with_one_line(args, f"{empty}: not a checkpoint folder (no config.json)")


# ----------------------------------------------------------------------------- input files the readers refuse


@pytest.mark.parametrize(
    "command",
    [
        ["data", "convert", "{f}", "-f", "flashrag", "--out", "{out}/o.jsonl"],
        ["data", "convert", "{f}", "-f", "hotpotqa", "--out", "{out}/o.jsonl"],
        ["corpus", "build", "{f}", "--out", "{out}/c.jsonl"],
        ["index", "-c", "{f}", "--out", "{out}/idx"],
        ["sft", "--trajectories", "{f}", "--run-dir", "{out}/run"],
    ],
)
def test_a_binary_input_names_the_file(command: list[str], tmp_path: Path) -> None:
    binary = tmp_path / "in.jsonl"
    binary.write_bytes(BINARY)
    out = tmp_path / "out"
    args = [a.format(f=binary, out=out) for a in command]
    fails_with_one_line(args, f"{binary}:1: not UTF-8 text (byte 0xff at column 1)")
    assert not out.exists()  # nothing written, not even the run folder's config


def test_a_non_utf8_line_after_good_ones_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "1", "question": "q?", "golden_answers": ["a"]}\n{"id": "2", "question": "caf\xe9?"}\n')
    fails_with_one_line(["data", "convert", str(path), "-f", "flashrag", "-o", str(tmp_path / "o.jsonl")], f"{path}:2: not UTF-8")


def test_corpus_errors_name_the_corpus_file(tmp_path: Path) -> None:
    dup = write_lines(tmp_path / "dup.jsonl", [{"id": "a", "contents": "T\nhello"}, {"id": "a", "contents": "U\nworld"}])
    fails_with_one_line(
        ["index", "-c", str(dup), "-o", str(tmp_path / "i1")], f"{dup}:2: duplicate passage id 'a' (first at {dup}:1)"
    )
    noword = write_lines(tmp_path / "noword.jsonl", [{"id": "a", "contents": "!!!"}, {"id": "b", "contents": "the"}])
    fails_with_one_line(["index", "-c", str(noword), "-o", str(tmp_path / "i2")], f"{noword}: no passage has an indexable word")
    parts = [{"id": "a", "contents": "Ada\nAda ran.", "partition": "x"}, {"id": "b", "contents": "...", "partition": "y"}]
    parted = write_lines(tmp_path / "parted.jsonl", parts)
    fails_with_one_line(["index", "-c", str(parted), "-o", str(tmp_path / "i3")], f"{parted}: partition 'y': no passage has")


def test_convert_of_an_empty_file_writes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "o.jsonl"
    fails_with_one_line(["data", "convert", str(empty), "-f", "flashrag", "-o", str(out)], f"{empty}: no records to convert")
    assert not out.exists()


def test_records_without_gold_answers_are_refused_before_any_rollout(index: Path, tmp_path: Path) -> None:
    data = write_lines(tmp_path / "r.jsonl", [{"id": "1", "question": "q?", "golden_answers": []}])
    out = tmp_path / "ev"
    args = ["eval", "--policy", str(tmp_path / "none"), "--data", str(data), "-i", str(index), "--out", str(out)]
    fails_with_one_line(args, f"{data}:1: field 'golden_answers' is empty")
    assert not out.exists()
    fails_with_one_line(["data", "convert", str(data), "-f", "flashrag", "-o", str(tmp_path / "o.jsonl")], "is empty")


# ----------------------------------------------------------------------------- configs and values refused


def test_an_empty_config_names_the_file_and_leaves_no_run_folder(tmp_path: Path) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text("# nothing yet\n")
    run = tmp_path / "run"
    fails_with_one_line(["sft", "--config", str(config), "--run-dir", str(run)], f"{config}: empty config")
    assert not run.exists()


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text("max_steps: 3\nmax_steps: 4\n")
    fails_with_one_line(
        ["sft", "--config", str(config), "--run-dir", str(tmp_path / "r")], f"{config}:2: duplicate key 'max_steps'"
    )


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--limit", "0"], "EvalConfig.limit must be >= 1"),
        (["--limit", "-1"], "EvalConfig.limit must be >= 1"),
        (["-k", "0"], "EvalRolloutConfig.top_k must be >= 1, got 0"),
        (["--set", "rollout.batch_size=0"], "batch_size must be >= 1"),
    ],
)
def test_eval_refuses_counts_below_one(option: list[str], expected: str, records: Path, index: Path, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    args = ["eval", "--policy", str(tmp_path / "p"), "--data", str(records), "-i", str(index), "--out", str(out), *option]
    fails_with_one_line(args, expected)
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--max-steps", "0"], "SFTConfig.max_steps must be -1 (train by epochs) or >= 1, got 0"),
        (["--max-steps", "-3"], "got -3"),
        (["--set", "save_steps=-5"], "SFTConfig.save_steps must be >= 1, got -5"),
    ],
)
def test_sft_refuses_step_counts_the_trainer_would_misread(
    option: list[str], expected: str, records: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    fails_with_one_line(["sft", "--trajectories", str(records), "--run-dir", str(run), *option], expected)
    assert not run.exists()


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_other_stages_refuse_a_limit_below_one(limit: str, records: Path, index: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = ["--policy", str(tmp_path / "p"), "--data", str(records), "-i", str(index), "--limit", limit]
    fails_with_one_line(
        ["mcts", *common, "--run-dir", str(run)], f"--limit must be >= 1 (or left out: every record), got {limit}"
    )
    fails_with_one_line(["rft", *common, "--prm", "x", "--run-dir", str(run)], "RFTConfig.limit must be >= 1")
    fails_with_one_line(["rl", *common[:6], "--run-dir", str(run), "--set", f"limit={limit}"], "RLConfig.limit must be >= 1")
    audit = ["prm-audit", *common, "--prm", "x", "--out", str(tmp_path / "a.json")]
    fails_with_one_line(audit, f"--limit must be >= 1 (or left out: every record), got {limit}")
    assert not run.exists()


def test_rl_and_prm_leave_no_run_folder_when_an_input_is_missing(records: Path, index: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    missing = tmp_path / "missing.jsonl"
    rl = ["rl", "--policy", "p", "--data", str(missing), "-i", str(index), "--run-dir", str(run), "--process-reward", "none"]
    fails_with_one_line(rl, f"{missing}: no such file")
    fails_with_one_line(["prm", "--pairs", str(missing), "--init", "p", "--run-dir", str(run)], f"{missing}: no such file")
    assert not run.exists()


def test_retrieve_refuses_k_zero(index: Path) -> None:
    fails_with_one_line(["retrieve", "--index", str(index), "-k", "0", "q"], "k must be >= 1")


# ----------------------------------------------------------------------------- the one handler


def test_verbose_shows_the_traceback_before_the_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = ["data", "convert", str(empty), "-f", "flashrag", "-o", str(tmp_path / "o.jsonl")]
    result = runner.invoke(app, ["-v", *args])
    assert result.exit_code == 2
    assert "Traceback" in result.output and result.output.rstrip().splitlines()[-1].startswith("error: ")
    fails_with_one_line(args, "no records")  # and without -v, the line alone again


def test_error_line_maps_the_expected_errors_and_leaves_bugs() -> None:
    assert error_line(DataError("f.jsonl:3", "bad")) == "f.jsonl:3: bad"
    assert error_line(IsADirectoryError(21, "Is a directory", "/tmp/x")) == "/tmp/x: Is a directory"
    assert error_line(OSError(21, "Is a directory", "/tmp/.x.tmp", None, "out")) == "out: Is a directory"
    undecodable = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert error_line(undecodable) == "input is not UTF-8 text (invalid start byte at byte 0)"
    assert error_line(RuntimeError("a bug")) is None and error_line(KeyError("k")) is None


# ----------------------------------------------------------------------------- a backend that is not installed


@pytest.mark.parametrize("command", ["rl", "mcts", "eval"])
def test_vllm_backend_without_vllm_stops_before_any_work(
    command: str, records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout.backend: vllm`` where vLLM is not installed: exit 2 with one line naming the extra
    (``pip install 'prorag[vllm]'``), before any model loads or run folder is written."""
    import sys

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr("prorag.agent.backends.has_module", lambda package: False)
    run = tmp_path / "run"
    inputs = ["--policy", str(tmp_path / "policy"), "--data", str(records), "--index", str(tmp_path / "idx")]
    place = ["--run-dir", str(run)] if command != "eval" else ["--out", str(run)]
    fails_with_one_line([command, *place, *inputs, "--set", "rollout.backend=vllm"], "pip install 'prorag[vllm]'")
    assert not run.exists()
