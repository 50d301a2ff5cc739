"""Benchmark loaders on the real shared files, and on small hand-made fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prorag.core.errors import DataError
from prorag.data.benchmarks import FORMATS, iter_paragraphs, join_sentences, load_benchmark
from prorag.data.records import passage_id

HOTPOT_A = "hotpotqa/hotpot_dev_hard_a.jsonl"
MUSIQUE_DEV = "musique/musique_ans_dev_200.jsonl"


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def write_json(path: Path, items: Any) -> Path:
    path.write_text(json.dumps(items, indent=1), encoding="utf-8")
    return path


def raw_items(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]


def hf_to_original(item: dict[str, Any]) -> dict[str, Any]:
    """The same HotpotQA item in the original schema (``_id``, pair lists)."""
    out = {k: v for k, v in item.items() if k not in ("id", "supporting_facts", "context")}
    out["_id"] = item["id"]
    sf, ctx = item["supporting_facts"], item["context"]
    out["supporting_facts"] = [list(p) for p in zip(sf["title"], sf["sent_id"])]
    out["context"] = [[t, s] for t, s in zip(ctx["title"], ctx["sentences"])]
    return out


def musique_item(rid: str = "2hop__1_2", **over: Any) -> dict[str, Any]:
    """A small MuSiQue item: 4 paragraphs, two of them under one title, 2 hops."""
    item = {
        "id": rid,
        "question": "Where was the author of Book X born?",
        "answer": "Paris",
        "answer_aliases": ["Paris, France", "Paris"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "Book X", "paragraph_text": "Book X was written by Ann Lee.", "is_supporting": True},
            {"idx": 1, "title": "Ann Lee", "paragraph_text": "Ann Lee was born in Paris.", "is_supporting": True},
            {"idx": 2, "title": "Ann Lee", "paragraph_text": "Ann Lee later moved to Rome.", "is_supporting": False},
            {"idx": 3, "title": "Rome", "paragraph_text": "Rome is a city.", "is_supporting": False},
        ],
        "question_decomposition": [
            {"id": 1, "question": "Book X >> author", "answer": "Ann Lee", "paragraph_support_idx": 0},
            {"id": 2, "question": "#1 >> place of birth", "answer": "Paris", "paragraph_support_idx": 1},
        ],
    }
    item.update(over)
    return item


def twowiki_item() -> dict[str, Any]:
    return {
        "_id": "8813f87c0bdd11eba7f7acde48001122",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War?",
        "context": [
            ["Polish-Russian War (film)", ["Polish-Russian War is a 2009 Polish film.", "It was directed by Xawery Żuławski."]],
            ["Xawery Żuławski", ["Xawery Żuławski (born 1971) is a Polish film director.", "His mother is Małgorzata Braunek."]],
            ["Other film", ["Other film is a film."]],
        ],
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 1]],
        "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"], ["Xawery Żuławski", "mother", "Małgorzata Braunek"]],
        "answer": "Małgorzata Braunek",
    }


# ----------------------------------------------------------------------------- real files


@pytest.mark.parametrize(
    ("rel", "fmt", "rows"),
    [
        ("hotpotqa/hotpot_dev_hard_a.jsonl", "hotpotqa", 300),
        ("hotpotqa/hotpot_dev_hard_b.jsonl", "hotpotqa", 500),
        ("hotpotqa/hotpot_dev_hard_c.jsonl", "hotpotqa", 300),
        ("musique/musique_ans_dev_200.jsonl", "musique", 200),
        ("train/musique_train.json", "musique", 100),
        ("train/hotpotqa_train.json", "hotpotqa", 100),
        ("bamboogle/test.jsonl", "flashrag", 125),
        ("popqa/test_1000.jsonl", "flashrag", 1000),
        ("nq/test_1000.jsonl", "flashrag", 1000),
        ("triviaqa/test_1000.jsonl", "flashrag", 1000),
    ],
)
def test_row_counts(benchmarks_dir: Path, rel: str, fmt: str, rows: int) -> None:
    loaded = load_benchmark(benchmarks_dir / rel, fmt)
    assert len(loaded.records) == rows
    assert loaded.skipped == {}
    assert all(r.metadata["source"] == fmt for r in loaded.records)
    assert len({r.id for r in loaded.records}) == rows


def test_hotpot_types_and_levels(benchmarks_dir: Path) -> None:
    records = [
        r for x in "abc" for r in load_benchmark(benchmarks_dir / f"hotpotqa/hotpot_dev_hard_{x}.jsonl", "hotpotqa").records
    ]
    types = [r.metadata["type"] for r in records]
    assert (types.count("bridge"), types.count("comparison")) == (862, 238)  # README figures
    assert {r.metadata["level"] for r in records} == {"hard"}
    assert {r.metadata["hops"] for r in records} == {2}


def test_hotpot_gold_by_hand(benchmarks_dir: Path) -> None:
    rec = load_benchmark(benchmarks_dir / HOTPOT_A, "hotpotqa").records[0]
    assert rec.id == "5a8ce55f554299441c6b9f62"
    assert rec.golden_answers == ["Tulsa"]
    assert rec.metadata["gold_titles"] == ["Tinted Windows (album)", "Tinted Windows (band)"]
    assert rec.metadata["supporting_facts"] == [["Tinted Windows (album)", 0], ["Tinted Windows (band)", 3]]
    album = (
        "Tinted Windows is the eponymous debut album of the American supergroup, Tinted Windows."
        " Tinted Windows was formed in New York City and consists of guitarist James Iha, previously of"
        " The Smashing Pumpkins and A Perfect Circle, singer Taylor Hanson of Hanson, bassist Adam"
        " Schlesinger of Fountains of Wayne and Ivy, and Cheap Trick's Bun E. Carlos."
        " The album was recorded at Stratosphere Sound Studios in New York, which Schlesinger and Iha"
        " co-own with Ivy's Andy Chase."
    )
    raw = raw_items(benchmarks_dir / HOTPOT_A)[0]["context"]
    band = "".join(raw["sentences"][raw["title"].index("Tinted Windows (band)")])
    assert band.startswith("Tinted Windows is an American rock supergroup") and "  " not in band
    assert rec.metadata["gold_doc_ids"] == [
        passage_id("Tinted Windows (album)", album),
        passage_id("Tinted Windows (band)", band),
    ]
    # and they are exactly the ids of the item's paragraphs with those titles
    paragraphs = dict(zip(raw["title"], raw["sentences"]))
    assert rec.metadata["gold_doc_ids"] == [passage_id(t, "".join(paragraphs[t])) for t in rec.metadata["gold_titles"]]


def test_hotpot_gold_matches_supporting_titles_everywhere(benchmarks_dir: Path) -> None:
    for rel in (HOTPOT_A, "train/hotpotqa_train.json"):
        for raw, rec in zip(raw_items(benchmarks_dir / rel), load_benchmark(benchmarks_dir / rel, "hotpotqa").records):
            sf = raw["supporting_facts"]
            titles = sf["title"] if isinstance(sf, dict) else [t for t, _ in sf]
            assert rec.metadata["gold_titles"] == list(dict.fromkeys(titles))
            assert len(rec.metadata["gold_doc_ids"]) == len(set(titles))


def test_both_hotpot_schemas_give_the_same_records(benchmarks_dir: Path, tmp_path: Path) -> None:
    items = raw_items(benchmarks_dir / HOTPOT_A)[:20]
    hf = load_benchmark(write_jsonl(tmp_path / "hf.jsonl", items), "hotpotqa").records
    orig = load_benchmark(write_json(tmp_path / "orig.json", [hf_to_original(i) for i in items]), "hotpotqa").records
    assert [r.to_dict() for r in hf] == [r.to_dict() for r in orig]
    # and the real original-schema train file has the same structure as the HF dev files
    train = load_benchmark(benchmarks_dir / "train/hotpotqa_train.json", "hotpotqa").records[0]
    assert (train.id, train.golden_answers) == ("5a77ec115542992a6e59dff7", ["a spirit"])  # from `_id`
    assert list(train.metadata) == list(hf[0].metadata)
    assert train.metadata["supporting_facts"] == [["Alû", 3], ["Lilu (mythology)", 0]]
    assert train.metadata["gold_titles"] == ["Alû", "Lilu (mythology)"]


def test_musique_decomposition_by_hand(benchmarks_dir: Path) -> None:
    records = {r.id: r for r in load_benchmark(benchmarks_dir / MUSIQUE_DEV, "musique").records}
    raw = {i["id"]: i for i in raw_items(benchmarks_dir / MUSIQUE_DEV)}

    def pid(rid: str, idx: int) -> str:
        p = raw[rid]["paragraphs"][idx]
        return passage_id(p["title"], p["paragraph_text"])

    r = records["2hop__574419_270105"]
    assert r.golden_answers == ["Stanley"]
    assert (r.metadata["hops"], r.metadata["type"]) == (2, "2hop")
    d1, d2 = r.metadata["decomposition"]
    assert d1 == {
        "question": "Van Hook Township >> located in the administrative territorial entity",
        "answer": "Mountrail County",
        "doc_ids": [pid(r.id, 8)],
        "titles": ["Van Hook Township, Mountrail County, North Dakota"],
    }
    assert d2["question"] == "#1 >> capital"
    assert d2["question_resolved"] == "Mountrail County >> capital"
    assert (d2["doc_ids"], d2["titles"]) == ([pid(r.id, 1)], ["Mountrail County Courthouse"])
    assert r.metadata["gold_doc_ids"] == [pid(r.id, 8), pid(r.id, 1)]
    assert r.metadata["gold_titles"] == ["Van Hook Township, Mountrail County, North Dakota", "Mountrail County Courthouse"]

    r3 = records["3hop1__53690_161697_73916"]
    assert r3.metadata["hops"] == 3
    steps = r3.metadata["decomposition"]
    assert [s["titles"] for s in steps] == [
        ["The Feminine Mystique"],
        ["Betty Friedan"],
        ["Household income in the United States"],
    ]
    assert "question_resolved" not in steps[0]
    assert steps[1]["question_resolved"] == "What nationality was Betty Friedan ?"
    assert steps[2]["question_resolved"] == "what is the average yearly income for an American"
    assert r3.metadata["gold_doc_ids"] == [pid(r3.id, 16), pid(r3.id, 3), pid(r3.id, 14)]


def test_musique_hops_and_aliases(benchmarks_dir: Path) -> None:
    records = load_benchmark(benchmarks_dir / MUSIQUE_DEV, "musique").records
    hops = [r.metadata["hops"] for r in records]
    assert (hops.count(2), hops.count(3), hops.count(4)) == (145, 32, 23)  # README figures
    benson = next(r for r in records if r.id == "2hop__335418_279684")
    assert benson.golden_answers == ["Pittsburgh Pirates", "Orioles", "Pirates", "Baltimore Orioles", "New York Mets", "Mets"]
    for r in records:  # every #k was resolved
        assert all("#" not in s.get("question_resolved", "") for s in r.metadata["decomposition"])


def test_flashrag_metadata_kept(benchmarks_dir: Path, tmp_path: Path) -> None:
    popqa = load_benchmark(benchmarks_dir / "popqa/test_1000.jsonl", "flashrag").records[0]
    assert popqa.id == "test_10207"
    assert popqa.golden_answers == ["Ralph Rainger", "Ralph Reichenthal"]
    assert popqa.metadata["s_wiki_title"] == "Easy Living (1937 film)"
    assert popqa.metadata["source"] == "flashrag"
    own = write_jsonl(
        tmp_path / "own.jsonl", [{"id": 1, "question": "q?", "golden_answers": "a", "metadata": {"source": "mine"}}]
    )
    rec = load_benchmark(own, "flashrag").records[0]
    assert (rec.id, rec.golden_answers, rec.metadata) == ("1", ["a"], {"source": "mine"})


# ----------------------------------------------------------------------------- fixtures


def test_musique_unanswerable_skipped_and_counted(tmp_path: Path) -> None:
    items = [
        musique_item("2hop__1_2"),
        musique_item("2hop__3_4", answerable=False),
        musique_item(
            "2hop__5_6",
            answerable=False,
            question_decomposition=[{"id": 5, "question": "?", "answer": "", "paragraph_support_idx": None}],
        ),
    ]
    for path in (write_jsonl(tmp_path / "m.jsonl", items), write_json(tmp_path / "m.json", items)):
        loaded = load_benchmark(path, "musique")
        assert [r.id for r in loaded.records] == ["2hop__1_2"]
        assert loaded.skipped == {"unanswerable": 2}


def test_musique_fixture_record(tmp_path: Path) -> None:
    rec = load_benchmark(write_jsonl(tmp_path / "m.jsonl", [musique_item()]), "musique").records[0]
    assert rec.golden_answers == ["Paris", "Paris, France"]  # answer first, duplicates dropped
    book, born = passage_id("Book X", "Book X was written by Ann Lee."), passage_id("Ann Lee", "Ann Lee was born in Paris.")
    assert rec.metadata["gold_doc_ids"] == [book, born]
    assert rec.metadata["gold_titles"] == ["Book X", "Ann Lee"]
    assert rec.metadata["decomposition"][1] == {
        "question": "#1 >> place of birth",
        "answer": "Paris",
        "doc_ids": [born],
        "titles": ["Ann Lee"],
        "question_resolved": "Ann Lee >> place of birth",
    }
    # both "Ann Lee" paragraphs are context paragraphs
    assert ("Ann Lee", "Ann Lee later moved to Rome.") in list(iter_paragraphs(tmp_path / "m.jsonl"))


def test_2wiki_fixture(tmp_path: Path) -> None:
    path = write_json(tmp_path / "2wiki_dev.json", [twowiki_item()])
    rec = load_benchmark(path, "2wiki").records[0]
    film = "Polish-Russian War is a 2009 Polish film. It was directed by Xawery Żuławski."
    person = "Xawery Żuławski (born 1971) is a Polish film director. His mother is Małgorzata Braunek."
    assert rec.id == "8813f87c0bdd11eba7f7acde48001122"
    assert rec.golden_answers == ["Małgorzata Braunek"]
    assert rec.metadata == {
        "source": "2wiki",
        "type": "compositional",
        "hops": 2,
        "gold_titles": ["Polish-Russian War (film)", "Xawery Żuławski"],
        "gold_doc_ids": [passage_id("Polish-Russian War (film)", film), passage_id("Xawery Żuławski", person)],
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 1]],
        "evidences": twowiki_item()["evidences"],
    }
    assert list(iter_paragraphs(path)) == [
        ("Polish-Russian War (film)", film),
        ("Xawery Żuławski", person),
        ("Other film", "Other film is a film."),
    ]
    # the HotpotQA loader reads 2Wiki's schema too, with the same texts
    assert load_benchmark(path, "hotpotqa").records[0].metadata["gold_doc_ids"] == rec.metadata["gold_doc_ids"]


def test_join_sentences() -> None:
    assert join_sentences(["A b.", " C d.", " E."]) == "A b. C d. E."  # HotpotQA: own spaces
    assert join_sentences(["A b.", "C d.", "E."]) == "A b. C d. E."  # 2Wiki: none
    assert join_sentences([" A b."]) == "A b."
    assert join_sentences([]) == ""


# ----------------------------------------------------------------------------- iter_paragraphs


def test_iter_paragraphs_on_paragraph_lists_and_maps(benchmarks_dir: Path) -> None:
    assert len(list(iter_paragraphs(benchmarks_dir / "corpora/2wiki_distractor_paragraphs.json"))) == 6119
    assert list(iter_paragraphs(benchmarks_dir / "bamboogle/test.jsonl")) == []
    # HippoRAG's HotpotQA corpus is a {title: [sentences]} map: same texts as the questions' contexts
    corpus = set(iter_paragraphs(benchmarks_dir / "train/hotpotqa_train_corpus.json"))
    assert len(corpus) == 994
    assert corpus == set(iter_paragraphs(benchmarks_dir / "train/hotpotqa_train.json"))
    musique = set(iter_paragraphs(benchmarks_dir / "train/musique_train_corpus.json"))
    assert musique <= set(iter_paragraphs(benchmarks_dir / "train/musique_train.json"))


def test_iter_paragraphs_ids_match_gold(benchmarks_dir: Path) -> None:
    ids = {passage_id(t, x) for t, x in iter_paragraphs(benchmarks_dir / MUSIQUE_DEV)}
    records = load_benchmark(benchmarks_dir / MUSIQUE_DEV, "musique").records
    assert all(set(r.metadata["gold_doc_ids"]) <= ids for r in records)


def test_iter_paragraphs_on_corpus_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"id": "x", "contents": "Title\nLine one.\nLine two."}])
    assert list(iter_paragraphs(path)) == [("Title", "Line one.\nLine two.")]


def test_iter_paragraphs_unknown_items(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    with pytest.raises(DataError, match=r"odd\.jsonl:1: unrecognised item"):
        list(iter_paragraphs(path))


# ----------------------------------------------------------------------------- malformed input


def test_missing_field_names_file_line_and_field(benchmarks_dir: Path, tmp_path: Path) -> None:
    items = raw_items(benchmarks_dir / HOTPOT_A)[:3]
    del items[2]["context"]
    path = tmp_path / "hotpot.jsonl"
    path.write_text("\n".join(json.dumps(i) for i in items[:2]) + "\n\n\n" + json.dumps(items[2]) + "\n")
    with pytest.raises(DataError) as err:
        load_benchmark(path, "hotpotqa")
    assert str(err.value) == f"{path}:5: field 'context' missing"


def test_wrong_type_names_field(tmp_path: Path) -> None:
    item = twowiki_item()
    item["context"] = "not a list"
    with pytest.raises(DataError, match=r"bad\.json: item 1 \(id=8813f87c0bdd11eba7f7acde48001122\): field 'context' must be"):
        load_benchmark(write_json(tmp_path / "bad.json", [item]), "2wiki")
    item = musique_item()
    item["paragraphs"][2]["title"] = 5
    with pytest.raises(DataError, match=r"bad\.jsonl:1: field 'paragraphs\[2\]\.title' must be a string, got a number"):
        load_benchmark(write_jsonl(tmp_path / "bad.jsonl", [item]), "musique")
    item = musique_item()
    item["question_decomposition"][0]["paragraph_support_idx"] = "0"
    with pytest.raises(DataError, match=r"field 'question_decomposition\[0\]\.paragraph_support_idx' must be an integer"):
        load_benchmark(write_jsonl(tmp_path / "bad.jsonl", [item]), "musique")


def test_paragraph_support_idx_out_of_range(benchmarks_dir: Path, tmp_path: Path) -> None:
    items = raw_items(benchmarks_dir / MUSIQUE_DEV)[:3]
    items[2]["id"] = "2hop__1"
    items[2]["question_decomposition"][1]["paragraph_support_idx"] = 25
    path = write_json(tmp_path / "musique.json", items)
    with pytest.raises(DataError) as err:
        load_benchmark(path, "musique")
    assert str(err.value) == f"{path}: item 3 (id=2hop__1): 'paragraph_support_idx' 25 out of range (20 paragraphs)"


def test_reference_to_a_later_hop(tmp_path: Path) -> None:
    item = musique_item()
    item["question_decomposition"][0]["question"] = "#2 >> author"
    with pytest.raises(DataError, match=r"m\.jsonl:1: field 'question_decomposition\[0\]\.question' refers to #2"):
        load_benchmark(write_jsonl(tmp_path / "m.jsonl", [item]), "musique")


@pytest.mark.parametrize(
    ("rel", "fmt", "looks_like", "expected"),
    [
        (MUSIQUE_DEV, "hotpotqa", "musique", "supporting_facts, context"),
        (HOTPOT_A, "musique", "hotpotqa", "paragraphs, question_decomposition"),
        (HOTPOT_A, "flashrag", "hotpotqa", "golden_answers"),
        ("bamboogle/test.jsonl", "2wiki", "flashrag", "evidences"),
        ("corpora/2wiki_distractor_paragraphs.json", "hotpotqa", "paragraph list", "context"),
    ],
)
def test_wrong_format_chosen(benchmarks_dir: Path, rel: str, fmt: str, looks_like: str, expected: str) -> None:
    path = benchmarks_dir / rel
    with pytest.raises(DataError) as err:
        load_benchmark(path, fmt)
    msg = str(err.value)
    place = f"{path}:1" if rel.endswith(".jsonl") else f"{path}: item 1"
    assert msg.startswith(f"{place}: not a {fmt} item: expected fields ")
    assert expected in msg
    assert f"looks like a {looks_like} item" in msg


def test_paragraph_map_is_not_questions(benchmarks_dir: Path) -> None:
    with pytest.raises(DataError, match=r"hotpotqa_train_corpus\.json: a JSON object"):
        load_benchmark(benchmarks_dir / "train/hotpotqa_train_corpus.json", "hotpotqa")


def test_non_object_item_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"list\.json: item 2: expected a JSON object, got str"):
        load_benchmark(write_json(tmp_path / "list.json", [musique_item(), "oops"]), "musique")
    with pytest.raises(ValueError, match="unknown data format 'musiqe'.*did you mean 'musique'"):
        load_benchmark(tmp_path / "list.json", "musiqe")
    with pytest.raises(ValueError, match="'corpus' holds paragraphs, not questions"):
        load_benchmark(tmp_path / "list.json", "corpus")
    assert FORMATS == ("2wiki", "flashrag", "hotpotqa", "musique")


def test_invalid_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(musique_item()) + "\n" + '{"id": "2hop__x", "question": \n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: invalid JSON"):
        load_benchmark(path, "musique")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert load_benchmark(path, "hotpotqa").records == []
    assert list(iter_paragraphs(path)) == []
