"""How much of the test split could be answered without reading? (the memorisation audit)

A retrieval benchmark whose answers can be memorised measures nothing. On the test questions this
module scores the strongest *no-retrieval* predictors built from the training records alone, next
to chance: ``question_lookup`` (same question text; splits share none, so it must stay 0),
``template_prior`` (most frequent training answer, or answer position, of the template) and
``fact_recall`` (every training sub-answer fact remembered by majority over worlds and chained hop by
hop; near chance only because each world re-draws its facts).

The per-category maximum is the no-retrieval ceiling ``prorag world`` reports; a trained naive
policy cannot beat it except by luck.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from prorag.core.metrics import exact_match
from prorag.data.records import Record
from prorag.data.world.facts import RELATIONS, YEAR, World
from prorag.data.world.names import YEARS

Predictor = Callable[[Record], str | None]


def category(r: Record) -> str:
    """Audit category: chain1..chain4 (entity answers), chain_year, compare_which, compare_same."""
    m = r.metadata
    if m["type"] != "chain":
        return m["type"]
    return "chain_year" if m["answer_kind"] == "year" else f"chain{m['hops']}"


def _majority(counter: Counter[str]) -> str:
    # Ties break on the value itself, so the audit is deterministic.
    return min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def question_lookup(train: Sequence[Record]) -> Predictor:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in train:
        table[r.question][r.golden_answers[0]] += 1
    return lambda r: _majority(table[r.question]) if r.question in table else None


def _which_sides(r: Record) -> tuple[str, str]:
    """The two compared entities of a which-one question (subjects of its two year hops)."""
    year_hops = [h for h in r.metadata["decomposition"] if RELATIONS[h["relation"]].object == YEAR]
    return year_hops[0]["subject"], year_hops[-1]["subject"]


def template_prior(train: Sequence[Record]) -> Predictor:
    answers: dict[str, Counter[str]] = defaultdict(Counter)
    for r in train:
        t = r.metadata["template"]
        if r.metadata["type"] == "compare_which":
            answers[t]["first" if r.golden_answers[0] == _which_sides(r)[0] else "second"] += 1
        else:
            answers[t][r.golden_answers[0]] += 1

    def predict(r: Record) -> str | None:
        t = r.metadata["template"]
        if t not in answers:
            return None
        guess = _majority(answers[t])
        if r.metadata["type"] == "compare_which":
            first, second = _which_sides(r)
            return first if guess == "first" else second
        return guess

    return predict


def fact_recall(train: Sequence[Record]) -> Predictor:
    memory: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in train:
        for hop in r.metadata["decomposition"]:
            memory[(hop["subject"], hop["relation"])][hop["answer"]] += 1

    def recall_hops(r: Record) -> list[str | None]:
        """Recalled answer of each hop; a hop whose subject is not named in the question uses the previous recall."""
        out: list[str | None] = []
        for hop in r.metadata["decomposition"]:
            subject = hop["subject"] if hop["subject"] in r.question or not out else out[-1]
            seen = memory.get((subject, hop["relation"])) if subject is not None else None
            out.append(_majority(seen) if seen else None)
        return out

    def predict(r: Record) -> str | None:
        recalled = recall_hops(r)
        kind = r.metadata["type"]
        if kind == "chain":
            return recalled[-1]
        ends = [
            v
            for v, h in zip(recalled, r.metadata["decomposition"], strict=True)
            if h["relation"] == r.metadata["decomposition"][-1]["relation"]
        ]
        if len(ends) < 2 or ends[0] is None or ends[-1] is None:
            return None
        if kind == "compare_same":
            return "yes" if ends[0] == ends[-1] else "no"
        first, second = _which_sides(r)
        earlier = first if ends[0] < ends[-1] else second
        later = second if earlier == first else first
        return earlier if r.metadata["template"].endswith("earlier") else later

    return predict


def chance(r: Record, worlds: dict[str, World]) -> float:
    """Probability that a uniform guess over the answer's candidates is right."""
    kind = r.metadata["answer_kind"]
    if kind in ("which", "yes_no"):
        return 0.5
    if kind == "year":
        return 1.0 / len(YEARS)
    last = RELATIONS[r.metadata["decomposition"][-1]["relation"]]
    return 1.0 / len(worlds[r.metadata["partition"]].entities[last.object])


def memorisation_audit(train: Sequence[Record], test: Sequence[Record], worlds: dict[str, World]) -> dict[str, dict[str, Any]]:
    """Per test category: n, chance, each predictor's EM and the best of them."""
    predictors = {
        "question_lookup": question_lookup(train),
        "template_prior": template_prior(train),
        "fact_recall": fact_recall(train),
    }
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in test:
        groups[category(r)].append(r)
        groups["all"].append(r)
    report: dict[str, dict[str, Any]] = {}
    for cat in sorted(groups):
        recs = groups[cat]
        row: dict[str, Any] = {"n": len(recs), "chance": sum(chance(r, worlds) for r in recs) / len(recs)}
        for name, predict in predictors.items():
            preds = [predict(r) for r in recs]
            row[f"{name}_em"] = sum(
                exact_match(p, r.golden_answers) if p is not None else 0.0 for p, r in zip(preds, recs, strict=True)
            ) / len(recs)
        row["best_memoriser_em"] = max(row[f"{n}_em"] for n in predictors)
        report[cat] = row
    return report
