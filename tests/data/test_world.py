"""The built-in world: determinism, split hygiene, gold consistency, and the memorisation audit."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from prorag.data.records import read_passages, read_records
from prorag.data.world import SIZES, build_world
from prorag.data.world.audit import memorisation_audit
from prorag.data.world.documents import render_documents
from prorag.data.world.facts import RELATIONS, sample_world
from prorag.data.world.names import YEARS, name_clusters, name_pool
from prorag.data.world.questions import generate_questions, relation_paths

FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "world.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_world(out, seed=0, size="tiny")
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    build_world(out, seed=3, size="demo")
    return out


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path: Path, tiny: Path) -> None:
    again = tmp_path / "again"
    build_world(again, seed=0, size="tiny")
    for name in FILES:
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    other = tmp_path / "other"
    build_world(other, seed=1, size="tiny")
    assert (other / "train.jsonl").read_bytes() != (tiny / "train.jsonl").read_bytes()


def test_wide_size_extends_the_demo_training_worlds_and_evaluates_on_new_worlds(tmp_path: Path, demo: Path) -> None:
    """`wide` is the demo's world shape with three times the training worlds: its first 20 training
    worlds have the demo's pages (facts are drawn per world index), and its dev and test worlds come
    after all 60, so they are new worlds."""
    wide = tmp_path / "wide"
    build_world(wide, seed=3, size="wide")
    assert {r.partition for r in read_records(str(wide / "train.jsonl"))} == {f"w{i:03d}" for i in range(60)}
    demo_pages = [(p.id, p.contents) for p in read_passages(str(demo / "corpus.jsonl")) if p.partition < "w020"]
    wide_pages = [(p.id, p.contents) for p in read_passages(str(wide / "corpus.jsonl")) if p.partition < "w020"]
    assert demo_pages and wide_pages == demo_pages
    assert {r.partition for r in read_records(str(wide / "test.jsonl"))} == {"w061"}
    assert {r.partition for r in read_records(str(wide / "dev.jsonl"))} == {"w060"}


def test_name_pool_is_fixed_single_words_with_near_duplicates() -> None:
    pool = name_pool()
    assert len(pool) == len(set(pool)) >= 600
    assert all(re.fullmatch(r"[A-Z][a-z]{4,7}", n) for n in pool)
    multi = [c for c in name_clusters() if len(c) > 1]
    assert multi, "the pool must contain near-duplicate clusters"
    for cluster in multi:
        base = cluster[0]
        for v in cluster[1:]:
            assert len(v) == len(base) and sum(a != b for a, b in zip(v, base, strict=True)) == 1


def test_splits_share_no_question_and_eval_worlds_are_unseen(demo: Path) -> None:
    splits = {s: read_records(str(demo / f"{s}.jsonl")) for s in ("train", "dev", "test")}
    texts = {s: {r.question for r in rs} for s, rs in splits.items()}
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["dev"] and not texts["dev"] & texts["test"]
    parts = {s: {r.partition for r in rs} for s, rs in splits.items()}
    assert len(parts["train"]) == SIZES["demo"].train_worlds
    assert not parts["train"] & parts["test"] and not parts["train"] & parts["dev"] and not parts["dev"] & parts["test"]
    ids = [r.id for rs in splits.values() for r in rs]
    assert len(ids) == len(set(ids))


def test_gold_evidence_is_in_the_corpus_and_states_each_sub_answer(demo: Path) -> None:
    corpus = {p.id: p for p in read_passages(str(demo / "corpus.jsonl"))}
    records = read_records(str(demo / "test.jsonl")) + read_records(str(demo / "train.jsonl"))[:500]
    for r in records:
        m = r.metadata
        assert m["gold_doc_ids"] and set(m["gold_doc_ids"]) <= corpus.keys()
        for hop in m["decomposition"]:
            for pid in hop["support_doc_ids"]:
                page = corpus[pid]
                assert page.partition == r.partition
                assert hop["answer"] in page.text, (r.id, hop, page.contents)
            assert corpus[hop["doc_ids"][0]].title == hop["titles"][0]
        if m["type"] == "chain":
            assert r.golden_answers == [m["decomposition"][-1]["answer"]]
            assert m["decomposition"][0]["subject"] in r.question


def test_fact_passages_are_the_page_sentences_and_keep_questions_and_gold(tmp_path: Path, tiny: Path) -> None:
    """``passages="fact"`` cuts every page into its sentences (intro left out): the same
    questions, and each hop's gold evidence is the one sentence that states its sub-answer."""
    import dataclasses

    out = tmp_path / "fact"
    build_world(out, seed=0, size=dataclasses.replace(SIZES["tiny"], passages="fact"))
    for split in ("train", "dev", "test"):
        assert [r.question for r in read_records(str(out / f"{split}.jsonl"))] == [
            r.question for r in read_records(str(tiny / f"{split}.jsonl"))
        ]
    pages = {p.id: p for p in read_passages(str(tiny / "corpus.jsonl"))}
    facts = {p.id: p for p in read_passages(str(out / "corpus.jsonl"))}
    for pid, p in facts.items():
        page = pages[pid.rsplit("/", 1)[0]]
        assert p.title == page.title and p.partition == page.partition
        assert p.text.count(". ") == 0 and p.text in page.text  # one sentence of that page
    # Every sentence of every page but the intro is a passage.
    assert len(facts) == sum(len(re.findall(r"[.!?](?:\s|$)", p.text)) - 1 for p in pages.values())
    for r in read_records(str(out / "test.jsonl")):
        for hop in r.metadata["decomposition"]:
            for pid in hop["support_doc_ids"]:
                assert hop["answer"] in facts[pid].text, (r.id, hop, facts[pid].contents)


def test_hops_kinds_and_yes_no_balance(demo: Path) -> None:
    train = read_records(str(demo / "train.jsonl"))
    hops = Counter(r.metadata["hops"] for r in train if r.metadata["type"] == "chain")
    assert set(hops) == {1, 2, 3, 4}
    yes_no = Counter(r.golden_answers[0] for r in train if r.metadata["type"] == "compare_same")
    assert yes_no["yes"] + yes_no["no"] > 100
    assert 0.4 < yes_no["yes"] / (yes_no["yes"] + yes_no["no"]) < 0.6
    which = [r for r in train if r.metadata["type"] == "compare_which"]
    assert which and all(r.metadata["hops"] >= 2 for r in which)


def test_comparison_answers_follow_the_gold_sub_answers(demo: Path) -> None:
    for r in read_records(str(demo / "test.jsonl")):
        m = r.metadata
        ends = [h for h in m["decomposition"] if h["relation"] == m["decomposition"][-1]["relation"]]
        if m["type"] == "compare_same":
            assert r.golden_answers == ["yes" if ends[0]["answer"] == ends[-1]["answer"] else "no"]
        elif m["type"] == "compare_which":
            (a, ya), (b, yb) = (ends[0]["subject"], ends[0]["answer"]), (ends[-1]["subject"], ends[-1]["answer"])
            earlier = a if ya < yb else b
            expected = earlier if m["template"].endswith("earlier") else (b if earlier == a else a)
            assert r.golden_answers == [expected]


def test_relation_paths_are_type_consistent() -> None:
    for length in (1, 2, 3, 4):
        paths = relation_paths(length)
        assert paths and all(len(p) == length for p in paths)
        for p in paths:
            for a, b in zip(p, p[1:]):
                assert a.object == b.subject
    assert all(p[0].name != "birth_year" for p in relation_paths(2)), "a year cannot start another hop"


def test_memorisation_audit_on_unseen_world_is_near_chance(demo: Path) -> None:
    import json

    audit = json.loads((demo / "world.json").read_text())["memorisation_audit"]["test"]
    assert audit["all"]["question_lookup_em"] == 0.0
    for cat in ("chain1", "chain2", "chain3", "chain4", "chain_year"):
        if cat in audit:
            assert audit[cat]["best_memoriser_em"] <= audit[cat]["chance"] + 0.05, (cat, audit[cat])
    for cat in ("compare_same", "compare_which"):
        assert audit[cat]["best_memoriser_em"] <= 0.65, (cat, audit[cat])


def test_audit_detects_a_leaky_split() -> None:
    """Negative control: questions drawn from a training world are answered by fact recall."""
    import random

    cfg = SIZES["tiny"]
    world = sample_world("w000", random.Random(0), cfg.entities, name_clusters(), 0.3, YEARS)
    docs = render_documents(world, random.Random(1))
    from prorag.data.world.generator import to_record

    qs = generate_questions(world, docs, random.Random(2), 120, {"chain1": 1.0, "chain2": 1.0}, 0.3)
    records = [to_record(q, world, "train", i) for i, q in enumerate(qs)]
    leaky_train, leaky_test = records[:80], records[80:]
    audit = memorisation_audit(leaky_train, leaky_test, {"w000": world})
    assert audit["all"]["fact_recall_em"] > 0.5
    assert audit["all"]["best_memoriser_em"] > audit["all"]["chance"] + 0.3


def test_relations_table_surface_forms_mention_subject() -> None:
    for rel in RELATIONS.values():
        for template in (rel.fact, rel.question, rel.phrase, rel.query):
            assert "{s}" in template
        assert "{o}" in rel.fact


def test_world_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prorag.cli import app

    result = CliRunner().invoke(app, ["world", "--out", str(tmp_path / "w"), "--size", "tiny", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert "no-retrieval ceiling" in result.output
    for name in FILES:
        assert (tmp_path / "w" / name).stat().st_size > 0
    bad = CliRunner().invoke(app, ["world", "--out", str(tmp_path / "x"), "--size", "huge"])
    assert bad.exit_code != 0


def test_rl_worlds_come_after_the_test_worlds_and_change_no_other_file(tmp_path: Path, tiny: Path) -> None:
    """`rl_worlds` adds worlds for RL alone: a few questions each in `rl.jsonl`, their pages at the end of
    the corpus, and every other split's file byte for byte the world without them."""
    from dataclasses import replace

    out = tmp_path / "rl"
    summary = build_world(out, seed=0, size=replace(SIZES["tiny"], rl_worlds=6, rl_questions_per_world=2))
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (tiny / name).read_bytes(), name
    base = (tiny / "corpus.jsonl").read_bytes()
    assert (out / "corpus.jsonl").read_bytes().startswith(base) and len((out / "corpus.jsonl").read_bytes()) > len(base)
    rl = read_records(str(out / "rl.jsonl"))
    # tiny: 3 training worlds (w000-w002), dev w003, test w004; the RL worlds are w005-w010.
    per_world = Counter(r.partition for r in rl)
    assert set(per_world) <= {f"w{i:03d}" for i in range(5, 11)} and max(per_world.values()) <= 2
    assert len(per_world) >= 5 and summary.counts["rl_questions"] == len(rl)
    others = {r.question for s in ("train", "dev", "test") for r in read_records(str(out / f"{s}.jsonl"))}
    assert not {r.question for r in rl} & others
    passages = {p.id: p for p in read_passages(str(out / "corpus.jsonl"))}
    for r in rl:  # each RL question's evidence is in its own world's pages
        assert r.metadata["split"] == "rl" and r.metadata["gold_doc_ids"]
        assert all(passages[d].partition == r.partition for d in r.metadata["gold_doc_ids"])
    meta = json.loads((out / "world.json").read_text())
    assert meta["partitions"]["rl"] == [f"w{i:03d}" for i in range(5, 11)]
    assert not (tiny / "rl.jsonl").exists() and "rl" not in json.loads((tiny / "world.json").read_text())["partitions"]
    with pytest.raises(ValueError, match="rl_questions_per_world"):
        replace(SIZES["tiny"], rl_worlds=2, rl_questions_per_world=0)
