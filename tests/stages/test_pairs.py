"""Step pairs from search trees: sibling sets with enough visits, the pairs-file contract, resume,
and the agreement between two judges."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from prorag.data.jsonl import read_jsonl
from prorag.data.records import read_records
from prorag.method.search_tree import Node, SearchTree
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.mcts import MCTSConfig, TreeSearch
from prorag.stages.pairs import PairsConfig, agreement_report, extract_pairs, judge_agreement, sibling_sets, step_view
from prorag.supervision.judge import Judgement, JudgeRequest, OracleJudge
from tests.stages.test_mcts import _fork_model
from tests.supervision.test_judge import CHAIN, SAENAX_DOCS

PROMPT = [100, 101]


def _node(
    text: str, kind: str, content: str, ids: list[int], q: float, n: int, depth: int, env: str = "", env_ids: Sequence[int] = ()
) -> Node:
    return Node(
        action_ids=ids,
        env_ids=list(env_ids),
        action_text=text,
        env_text=env,
        kind=kind,
        content=content,
        q=q,
        visits=n,
        depth=depth,
    )


def _tree() -> SearchTree:
    """Root: a valid search (Q .5), a leap to hop 2 (Q .8, invalid), a guessed answer visited once.
    Below the valid search: the right conclusion and a wrong one."""
    good = _node("<step> a </step><subquery> Saenax director </subquery>", "search", "Saenax director", [1, 2], 0.5, 3, 1,
                 env="\n" + SAENAX_DOCS + "\n<step>", env_ids=[7, 8, 9])  # fmt: skip
    leap = _node("<step> b </step><subquery> Siril born </subquery>", "search", "Siril born", [1, 3], 0.8, 3, 1)
    guess = _node("<step> c </step><answer> Krirek </answer>", "answer", "Krirek", [1, 4], 1.0, 1, 1)
    good.children = [
        _node(" d </step><subanswer> Siril </subanswer>", "conclude", "Siril", [5], 0.9, 2, 2),
        _node(" e </step><subanswer> Tamal </subanswer>", "conclude", "Tamal", [6], 0.1, 2, 2),
    ]
    leap.children = [_node(" f </step><subanswer> Tamal </subanswer>", "conclude", "Tamal", [11], 0.8, 3, 2)]
    return SearchTree(record=CHAIN.to_dict(), prompt_ids=PROMPT, root=Node(visits=7, children=[good, leap, guess]), simulations=7)


def test_sibling_sets_need_two_children_with_enough_visits() -> None:
    tree = _tree()
    sets = list(sibling_sets(tree, min_visits=2))
    assert [s.id for s in sets] == ["w4-q1@root", "w4-q1@0"]
    assert len(sets[0].candidates) == 2, "the guess visited once is left out"
    assert len(list(sibling_sets(tree, 1))[0].candidates) == 3
    assert [s.id for s in sibling_sets(tree, 3)] == ["w4-q1@root"]
    view = step_view(tree.root.children[0].children[0])
    assert view.text.startswith("<step> d </step>"), "the environment's <step> opener is shown"


def test_oracle_pairs_follow_the_contract_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    summary = extract_pairs([_tree()], out, PairsConfig(min_visits=2))
    assert (summary.sibling_sets, summary.judged, summary.pairs) == (2, 2, 2)
    rows = list(read_jsonl(out))
    first, second = rows
    assert set(first) == {
        "id", "question_id", "question", "partition", "context_ids", "chosen_ids", "rejected_ids", "context_text",
        "chosen_text", "rejected_text", "chosen_kind", "rejected_kind", "chosen_q", "chosen_n", "rejected_q",
        "rejected_n", "judge", "reason", "depth",
    }  # fmt: skip
    assert (first["chosen_kind"], first["rejected_kind"]) == ("search", "search")
    # At the root the valid search is chosen over the better-scored leap.
    assert first["id"] == "w4-q1@root" and first["context_ids"] == PROMPT and first["context_text"] == ""
    assert (first["chosen_ids"], first["rejected_ids"]) == ([1, 2], [1, 3])
    assert (first["chosen_q"], first["chosen_n"], first["rejected_q"], first["rejected_n"]) == (0.5, 3, 0.8, 3)
    assert first["judge"] == "oracle" and first["depth"] == 1 and first["partition"] == "w4" and first["question_id"] == "w4-q1"
    # Below it the context holds the search and its retrieval (ending with the environment's <step>).
    assert second["context_ids"] == [*PROMPT, 1, 2, 7, 8, 9]
    assert second["context_text"].endswith("</retrieval>\n<step>")
    assert (second["chosen_ids"], second["rejected_ids"], second["depth"]) == ([5], [6], 2)
    assert "supported" in second["reason"]
    # A rerun writes nothing new; a cut last line is repaired and that pair written again.
    assert extract_pairs([_tree()], out, PairsConfig()).already_done == 2
    assert len(list(read_jsonl(out))) == 2
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + lines[1][:40])
    again = extract_pairs([_tree()], out, PairsConfig())
    assert (again.already_done, again.pairs) == (1, 1)
    assert [r["id"] for r in read_jsonl(out)] == ["w4-q1@root", "w4-q1@0"]


def test_all_combinations_of_a_sibling_set(tmp_path: Path) -> None:
    """``pairs_per_set: all``: at the root (the guess visited once takes part: a right answer,
    but nothing is worked out, so invalid) the valid search is paired with both invalid
    siblings, the judge's own pair (against the leap, the lowest Q) first; a rerun adds nothing."""
    out = tmp_path / "pairs.jsonl"
    summary = extract_pairs([_tree()], out, PairsConfig(min_visits=1, pairs_per_set="all"))
    rows = list(read_jsonl(out))
    assert (summary.pairs, summary.extra_pairs) == (2, 1)
    assert [r["id"] for r in rows] == ["w4-q1@root", "w4-q1@root#0>2", "w4-q1@0"]
    assert (rows[0]["chosen_ids"], rows[0]["rejected_ids"]) == ([1, 2], [1, 3])
    assert (rows[1]["chosen_ids"], rows[1]["rejected_ids"], rows[1]["rejected_kind"]) == ([1, 2], [1, 4], "answer")
    assert "a guess" in rows[1]["reason"] and rows[1]["rejected_q"] == 1.0
    assert extract_pairs([_tree()], out, PairsConfig(min_visits=1, pairs_per_set="all")).already_done == 2
    assert len(list(read_jsonl(out))) == 3
    # "one" (the paper) on the same trees: one pair per set.
    one = extract_pairs([_tree()], tmp_path / "one.jsonl", PairsConfig(min_visits=1))
    assert (one.pairs, one.extra_pairs) == (2, 0)


def test_pairs_from_a_real_search(world_tokenizer: Any, tiny_retriever: BM25Retriever, tiny_world: Path, tmp_path: Path) -> None:
    """MCTS on a scripted policy (gold actions, or an empty action by chance) -> oracle pairs:
    the gold action is chosen, the empty one rejected, with the tree's exact context ids."""
    records = read_records(tiny_world / "test.jsonl")[:3]
    model = _fork_model(world_tokenizer, tiny_retriever, records)
    cfg = MCTSConfig(
        simulations=4, num_candidates=4, trees_per_batch=3, rollout=replace(MCTSConfig().rollout, max_action_tokens=64)
    )
    trees = TreeSearch(model, world_tokenizer, tiny_retriever, cfg).run(records)
    out = tmp_path / "pairs.jsonl"
    summary = extract_pairs(trees, out, PairsConfig(min_visits=1))
    rows = list(read_jsonl(out))
    assert summary.pairs == len(rows) >= 3
    eos = world_tokenizer.eos_token_id
    for row in rows:
        step = world_tokenizer.get_vocab()["<step>"]
        assert row["rejected_ids"] == ([step, eos] if row["depth"] == 1 else [eos]), (
            "the empty action (the root's writes its own <step>)"
        )
        assert row["chosen_q"] > row["rejected_q"] == 0.0
        full = row["context_ids"] + row["chosen_ids"]
        prompt = next(p for p in model.targets if list(p) == row["context_ids"][: len(p)])
        gold = list(prompt) + model.targets[prompt]
        assert full == gold[: len(full)], "context + chosen step is a prefix of the gold trajectory, token for token"


def test_pairs_config_is_checked() -> None:
    with pytest.raises(ValueError, match="min_visits"):
        PairsConfig(min_visits=0)
    with pytest.raises(ValueError, match="llm settings"):
        PairsConfig(judge="llm")
    with pytest.raises(ValueError, match="pairs_per_set"):
        PairsConfig(pairs_per_set="some")  # type: ignore[arg-type]


def test_judge_agreement_counts() -> None:
    a = [Judgement(0, 1, ""), Judgement(0, 1, ""), None, None, Judgement(2, 0, "")]
    b = [Judgement(0, 1, ""), Judgement(1, 0, ""), None, Judgement(0, 1, ""), Judgement(2, 1, "")]
    got = judge_agreement(a, b)
    assert got == {"n": 5, "agreement": 2 / 5, "both_none": 1, "both_pair": 3, "same_pair": 1, "conflict": 1, "one_only": 1}
    with pytest.raises(ValueError):
        judge_agreement(a, b[:2])


class ReversedJudge:
    """Prefers the step with the higher Q whatever it says (what a judge trusting the hints does)."""

    name = "q-only"

    def judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]:
        out = []
        for r in requests:
            order = sorted(range(len(r.candidates)), key=lambda i: r.candidates[i].q)
            out.append(Judgement(order[-1], order[0], "higher Q"))
        return out


def test_agreement_report_between_two_judges() -> None:
    report = agreement_report([_tree()], ReversedJudge(), OracleJudge(), sample=5, min_visits=2)
    # Root: Q prefers the leap (conflict with the oracle); below: both prefer Siril over Tamal.
    assert report["judges"] == ["q-only", "oracle"]
    assert (report["n"], report["same_pair"], report["conflict"], report["agreement"]) == (2, 1, 1, 0.5)
    assert json.dumps(report)


def test_pointwise_labels_of_every_judged_node(tmp_path: Path) -> None:
    """Every node with ``min_visits`` visits gets the oracle's verdict as a label, siblings or
    not: at the root the valid search (1), the leap to hop 2 (0) and the guess (0); below the
    search the supported conclusion (1) and the wrong one (0); below the leap its only child, a
    conclusion of a hop that is not open yet (0). The file sits beside the pairs file; a rerun
    adds nothing."""
    from prorag.stages.pairs import pointwise_file

    out = tmp_path / "pairs.jsonl"
    summary = extract_pairs([_tree()], out, PairsConfig(min_visits=1))
    points = list(read_jsonl(pointwise_file(out)))
    assert pointwise_file(out) == tmp_path / "pairs.pointwise.jsonl"
    got = [(r["id"], r["label"], r["step_ids"]) for r in points]
    assert got == [
        ("w4-q1@root/0", 1, [1, 2]),
        ("w4-q1@root/1", 0, [1, 3]),
        ("w4-q1@root/2", 0, [1, 4]),
        ("w4-q1@0/0", 1, [5]),
        ("w4-q1@0/1", 0, [6]),
        ("w4-q1@1/0", 0, [11]),
    ]
    assert (summary.points, summary.valid_points) == (6, 2)
    assert points[3]["context_ids"] == [*PROMPT, 1, 2, 7, 8, 9] and "supported" in points[3]["reason"]
    assert points[2]["kind"] == "answer" and "a guess" in points[2]["reason"] and points[2]["judge"] == "oracle"
    assert extract_pairs([_tree()], out, PairsConfig(min_visits=1)).points == 0
    assert len(list(read_jsonl(pointwise_file(out)))) == 6
    # Off, or a judge with no per-step verdict (an LLM judge): no pointwise file.
    extract_pairs([_tree()], tmp_path / "off.jsonl", PairsConfig(pointwise=False))
    assert not pointwise_file(tmp_path / "off.jsonl").exists()

    class PairOnly:
        name = "llm"

        def judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]:
            return [Judgement(0, 1, "first") for _ in requests]

    assert extract_pairs([_tree()], tmp_path / "llm.jsonl", judge=PairOnly()).points == 0
    assert not pointwise_file(tmp_path / "llm.jsonl").exists()
