"""``prorag sft-data``: gold trajectories of a record file with the template or the LLM teacher,
real retrieval in the <retrieval> blocks, missing gold pages recorded, resuming, drops counted."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prorag.agent.gold import gold_hops, render_gold
from prorag.agent.schema import i_traj, parse_trajectory
from prorag.cli import app
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.retrieval.base import Hit
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import build_index
from prorag.stages.sft import load_trajectories
from prorag.stages.sft_data import SFTDataConfig, build_sft_data, default_cache_path, trajectory_chars
from prorag.supervision.llm_teacher import LLMTeacher, LLMTeacherConfig
from tests.fake_chat_server import FakeChatServer, Reply, good_thought, user_text


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")


def no_decomposition(rid: str = "plain-1") -> Record:
    return Record(rid, "Who wrote a question without a decomposition?", ["nobody"], {"source": "test"})


def check_rows(path: Path, retriever: BM25Retriever, records: Sequence[Record], k: int = 3) -> list[dict[str, Any]]:
    """Every row loads with load_trajectories, is a strictly valid ProRAG trajectory, and its
    <retrieval> blocks and ``retrievals`` are what the retriever returns for the hop's keywords."""
    rows = list(read_jsonl(path))
    trajs, recs = load_trajectories(path)
    assert recs is None and [t.id for t in trajs] == [r["id"] for r in rows]
    by_id = {r.id: r for r in records}
    for traj in trajs:
        record = by_id[traj.id]
        hops = gold_hops(record)
        assert i_traj(traj.text, strict=True) == 1, traj.text
        parsed = parse_trajectory(traj.text)
        assert parsed.answer == record.golden_answers[0]
        found = retriever.search([h.query for h in hops], k=k, partitions=[record.partition] * len(hops))
        assert [r["doc_ids"] for r in traj.retrievals] == [[h.id for h in hits] for hits in found]
        searches = [a for a in parsed.actions if a.retrieval is not None]
        assert [a.content for a in searches] == [h.query for h in hops]
        assert traj.missing_gold == [
            i for i, (h, hits) in enumerate(zip(hops, found)) if not set(h.doc_ids) & {x.id for x in hits}
        ]
    return rows


# ----------------------------------------------------------------------------- template teacher


def test_template_rows_are_render_gold_and_skip_records_without_decomposition(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever
) -> None:
    data = tmp_path / "records.jsonl"
    write_jsonl(data, [r.to_dict() for r in records[:10]] + [no_decomposition().to_dict()])
    out = tmp_path / "traj.jsonl"
    summary = build_sft_data(data, out, SFTDataConfig(chunk_size=4), retriever=tiny_retriever)
    assert (summary.records, summary.written, summary.skipped_no_decomposition, summary.already_done) == (11, 10, 1, 0)
    assert summary.hops == sum(len(gold_hops(r)) for r in records[:10]) and not summary.dropped
    rows = check_rows(out, tiny_retriever, records)
    # Exactly render_gold's trajectories (rendering is not re-implemented), with the teacher named.
    assert [{k: v for k, v in r.items() if k != "teacher"} for r in rows] == [
        t.to_dict() for t in render_gold(records[:10], tiny_retriever)
    ]
    assert {r["teacher"] for r in rows} == {"template"}
    text = summary.describe()
    assert "wrote 10 trajectories" in text and "1 without a gold decomposition" in text


class HidesGold:
    """A retriever that never returns the gold page of some hops (replaced by the next hit)."""

    def __init__(self, inner: BM25Retriever, hidden: set[str]) -> None:
        self.inner, self.hidden = inner, hidden

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        found = self.inner.search(queries, k=k + 3, partitions=partitions)
        return [[h for h in hits if h.id not in self.hidden][:k] for hits in found]


def test_missing_gold_pages_are_recorded_and_counted(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever
) -> None:
    chosen = records[:8]
    hidden = {gold_hops(chosen[0])[0].doc_ids[0], gold_hops(chosen[3])[-1].doc_ids[0]}
    retriever = HidesGold(tiny_retriever, hidden)
    summary = build_sft_data(chosen, tmp_path / "t.jsonl", retriever=retriever)
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "t.jsonl")}
    expected = {
        r.id: [i for i, h in enumerate(gold_hops(r)) if set(h.doc_ids) <= hidden] for r in chosen
    }  # each world hop has one gold page
    assert {rid: row["missing_gold"] for rid, row in rows.items()} == expected
    assert summary.missing_gold_hops == sum(len(v) for v in expected.values()) >= 2
    assert summary.missing_gold_trajectories == sum(1 for v in expected.values() if v)
    assert all(not set(d) & hidden for row in rows.values() for d in (r["doc_ids"] for r in row["retrievals"]))


def test_resume_skips_done_ids_and_repairs_a_cut_line(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever
) -> None:
    out = tmp_path / "traj.jsonl"
    first = build_sft_data(records, out, SFTDataConfig(limit=5), retriever=tiny_retriever)
    assert first.written == 5
    # A kill in the middle of the 5th row.
    text = out.read_text()
    out.write_text(text[: len(text) - 40])
    second = build_sft_data(records, out, SFTDataConfig(limit=12, chunk_size=3), retriever=tiny_retriever)
    assert (second.already_done, second.written) == (4, 8)
    ids = [r["id"] for r in read_jsonl(out)]
    assert ids == [r.id for r in records[:12]]  # each once, in file order, the cut one redone
    third = build_sft_data(records, out, SFTDataConfig(limit=12), retriever=tiny_retriever)
    assert (third.already_done, third.written) == (12, 0)
    check_rows(out, tiny_retriever, records)


def test_unrenderable_and_duplicate_records_are_dropped_and_counted(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever
) -> None:
    bad = copy.deepcopy(records[1])
    bad.id = "bad-empty-subanswer"
    bad.metadata["decomposition"][0]["answer"] = ""
    chosen = [records[0], bad, records[2], records[0]]
    summary = build_sft_data(chosen, tmp_path / "t.jsonl", retriever=tiny_retriever)
    assert summary.written == 2 and summary.dropped == {"cannot be rendered": 1} and summary.duplicate_ids == 1
    assert [r["id"] for r in read_jsonl(tmp_path / "t.jsonl")] == [records[0].id, records[2].id]


def test_over_long_trajectories_are_skipped_counted_and_reported(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever, caplog: pytest.LogCaptureFixture
) -> None:
    long = copy.deepcopy(records[1])
    long.id, long.question = "over-long", "pasted text " * 6_000 + records[1].question  # 72K characters
    with caplog.at_level(logging.WARNING, logger="prorag.stages.sft_data"):
        summary = build_sft_data([records[0], long, records[2]], tmp_path / "t.jsonl", retriever=tiny_retriever)
    assert summary.written == 2 and summary.over_long == 1 and not summary.dropped
    assert [r["id"] for r in read_jsonl(tmp_path / "t.jsonl")] == [records[0].id, records[2].id]
    assert "1 over max_chars" in summary.describe() and "over-long (72" in caplog.text
    assert "over max_chars" not in build_sft_data(records[:1], tmp_path / "u.jsonl", retriever=tiny_retriever).describe()
    # Rendered trajectories longer than the bound (their documents, not their question) are skipped too.
    sizes = [trajectory_chars(t) for t in render_gold(records[:4], tiny_retriever)]
    bound = max(sizes) - 1
    summary = build_sft_data(records[:4], tmp_path / "v.jsonl", SFTDataConfig(max_chars=bound), retriever=tiny_retriever)
    assert summary.over_long == sum(n > bound for n in sizes) >= 1 and summary.written == 4 - summary.over_long
    summary = build_sft_data([long], tmp_path / "w.jsonl", SFTDataConfig(max_chars=None), retriever=tiny_retriever)
    assert summary.written == 1 and summary.over_long == 0
    with pytest.raises(ValueError, match="max_chars must be >= 1"):
        SFTDataConfig(max_chars=0)


# ----------------------------------------------------------------------------- LLM teacher


def llm_config(server: FakeChatServer, cache: Path, **kw: Any) -> LLMTeacherConfig:
    base: dict[str, Any] = dict(
        base_url=server.url, model="fake-teacher", api_key_env="PRORAG_TEST_LLM_KEY", concurrency=4,
        max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02, timeout_s=5.0, cache_path=str(cache),
    )  # fmt: skip
    return LLMTeacherConfig(**(base | kw))


def test_llm_rows_hold_the_teachers_thoughts_and_malformed_records_are_never_written(
    tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever
) -> None:
    chosen = records[:6]
    broken = chosen[2]
    fixed = {"now": False}

    def behave(body: dict[str, Any], n: int) -> Reply:
        text = user_text(body)
        if f"Question: {broken.question}\n" in text and "Next action: give the final answer" in text and not fixed["now"]:
            return Reply(content="The answer is </answer> obvious.")
        return Reply(content=good_thought(body))

    out = tmp_path / "traj.jsonl"
    cache = tmp_path / "cache.jsonl"
    n_thoughts = sum(2 * len(gold_hops(r)) + 1 for r in chosen)
    with FakeChatServer(behave) as server:
        cfg = SFTDataConfig(teacher="llm", llm=llm_config(server, cache), chunk_size=4)
        summary = build_sft_data(chosen, out, cfg, retriever=tiny_retriever)
        assert summary.written == 5 and summary.dropped == {"LLM teacher failed a thought": 1}
        assert summary.llm is not None and summary.llm.failed_thoughts == 1
        rows = check_rows(out, tiny_retriever, chosen)
        assert broken.id not in {r["id"] for r in rows}
        assert "</answer> obvious" not in out.read_text()
        assert {r["teacher"] for r in rows} == {"llm:fake-teacher"}
        # The thoughts are the server's, one per action, not the template's.
        replies = {good_thought(s.body) for s in server.seen}
        for row in rows:
            thoughts = [a.thought for a in parse_trajectory("".join(t for t, _ in row["segments"])).actions]
            assert thoughts and all(t in replies for t in thoughts)
        assert server.n_requests == n_thoughts + 2  # two retries of the broken thought
        assert "LLM teacher fake-teacher" in summary.describe(cfg.llm)

        # Rerun once the server behaves: only the broken record is redone, and of it only the
        # thought that failed is asked (the other thoughts come from the cache).
        fixed["now"] = True
        before = server.n_requests
        again = build_sft_data(chosen, out, cfg, retriever=tiny_retriever)
        assert (again.already_done, again.written, sum(again.dropped.values())) == (5, 1, 0)
        assert server.n_requests - before == 1
        check_rows(out, tiny_retriever, chosen)

        # A fresh output with the same cache: no request at all, the same rows.
        before = server.n_requests
        build_sft_data(chosen, tmp_path / "fresh.jsonl", cfg, retriever=tiny_retriever)
        assert server.n_requests == before
    by_id = {r["id"]: r for r in read_jsonl(out)}
    fresh = list(read_jsonl(tmp_path / "fresh.jsonl"))
    assert len(fresh) == 6 and fresh == [by_id[r["id"]] for r in fresh]


def test_llm_teacher_searches_each_hop_once(tmp_path: Path, records: list[Record], tiny_retriever: BM25Retriever) -> None:
    """Rendering twice (collect the hits, then render the LLM's thoughts) searches only once."""

    class Counting:
        def __init__(self) -> None:
            self.queries = 0

        def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
            self.queries += len(queries)
            return tiny_retriever.search(queries, k=k, partitions=partitions)

    counting = Counting()
    with FakeChatServer() as server:
        teacher = LLMTeacher(llm_config(server, tmp_path / "c.jsonl"))
        build_sft_data(
            records[:5], tmp_path / "t.jsonl", SFTDataConfig(teacher="llm", llm=teacher.config), retriever=counting, llm=teacher
        )
    assert counting.queries == len({(h.query, r.partition) for r in records[:5] for h in gold_hops(r)})


# ----------------------------------------------------------------------------- the command


def test_sft_data_cli(tmp_path: Path, tiny_world: Path, records: list[Record], tiny_retriever: BM25Retriever) -> None:
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index", kind="bm25")
    runner = CliRunner()
    out = tmp_path / "traj.jsonl"
    base = ["sft-data", "--data", str(tiny_world / "train.jsonl"), "--index", str(tmp_path / "index"), "--out", str(out)]
    result = runner.invoke(app, [*base, "--limit", "4"])
    assert result.exit_code == 0, result.output
    assert "wrote 4 trajectories" in result.output and "gold page not retrieved: 0 hops" in result.output
    check_rows(out, tiny_retriever, records)

    with FakeChatServer() as server:
        llm_out = tmp_path / "llm.jsonl"
        args = ["sft-data", "--data", str(tiny_world / "train.jsonl"), "--index", str(tmp_path / "index"), "--out", str(llm_out)]
        args += ["--teacher", "llm", "--base-url", server.url, "--model", "fake", "--limit", "3", "--concurrency", "2"]
        args += ["--api-key-env", "PRORAG_TEST_LLM_KEY"]
        result = runner.invoke(app, [*args, "--price-input", "0.5"])
        assert result.exit_code == 0, result.output
        assert (
            "wrote 3 trajectories" in result.output and "LLM teacher fake" in result.output and "estimated cost" in result.output
        )
        assert Path(default_cache_path(llm_out)).is_file()
        check_rows(llm_out, tiny_retriever, records)

        # A key variable that is not set, or plain http to another host: exit 2 before any request.
        sent = server.n_requests
        args[args.index(str(llm_out))] = str(tmp_path / "llm2.jsonl")
        unset = runner.invoke(app, [*args, "--api-key-env", "PRORAG_TEST_UNSET_KEY"])
        assert unset.exit_code == 2 and "PRORAG_TEST_UNSET_KEY" in unset.output and "not set" in unset.output
        plain = runner.invoke(app, [*args, "--base-url", "http://api.example.com/v1"])
        assert plain.exit_code == 2 and "unencrypted" in plain.output and "allow_insecure_http" in plain.output
        assert server.n_requests == sent and "Traceback" not in unset.output + plain.output

    missing = runner.invoke(app, [*base, "--teacher", "llm", "--model", "m"])
    assert missing.exit_code == 2 and "--base-url" in missing.output
    stray = runner.invoke(app, [*base, "--base-url", "http://127.0.0.1:9/v1"])
    assert stray.exit_code == 2 and "--teacher llm" in stray.output
    (tmp_path / "broken.jsonl").write_text('{"id": "x", "question": "q"}\n')
    bad = runner.invoke(app, [*base[:2], str(tmp_path / "broken.jsonl"), *base[3:]])
    assert bad.exit_code == 2 and "broken.jsonl:1" in bad.output and "golden_answers" in bad.output
