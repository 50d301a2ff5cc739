"""Where an EM gain comes from: each evaluation's EM split into the yes/no questions (beside the
constant guess's EM there) and the rest, and by question type.

    python -m research.drivers.answer_types EVAL_DIR [EVAL_DIR ...] [--json OUT.json]

An EVAL_DIR is an evaluation's output folder (its ``predictions.jsonl``), e.g. ``RUN/eval/rft`` and
``RUN/eval/grpo-seed0``. A policy can gain EM on yes/no questions by answering one of the two words
more often, without reading: that gain is real EM but not better search or reasoning, and this
table separates it from a gain on the questions whose answer has to be found.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prorag.core.metrics import yes_no_scores
from prorag.data.jsonl import read_jsonl, write_json


def answer_type_split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """EM over all lines, over the yes/no ones and the rest (:func:`yes_no_scores`), and by ``type``."""
    by_type: dict[str, list[float]] = {}
    for r in rows:
        by_type.setdefault(str(r.get("type", "?")), []).append(float(r["em"]))
    em = sum(float(r["em"]) for r in rows) / len(rows)
    scores = yes_no_scores((r["prediction"], r["golden_answers"]) for r in rows)
    return {
        "n": len(rows),
        "em": em,
        # without yes/no questions every question is one of the rest
        **(scores if scores is not None else {"non_yes_no_n": float(len(rows)), "non_yes_no_em": em}),
        "by_type": {t: {"n": len(v), "em": sum(v) / len(v)} for t, v in sorted(by_type.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_dirs", nargs="+", type=Path, help="evaluation folders with predictions.jsonl")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    print(f"{'evaluation':<28} {'EM':>6} {'rest EM':>8} {'y/n EM':>7} {'const':>6} {'answered':>9} {'no share':>9}  by type")
    for folder in args.eval_dirs:
        path = folder / "predictions.jsonl"
        if not path.exists():
            raise SystemExit(f"{path}: no such file (expected an evaluation folder with predictions.jsonl)")
        s = out[str(folder)] = answer_type_split(list(read_jsonl(path)))
        pct = lambda key, s=s: f"{100 * s[key]:.1f}" if s.get(key) is not None else "-"  # noqa: E731
        types = "  ".join(f"{t} {100 * v['em']:.1f}" for t, v in s["by_type"].items())
        print(
            f"{folder.name:<28} {pct('em'):>6} {pct('non_yes_no_em'):>8} {pct('yes_no_em'):>7} {pct('yes_no_constant_em'):>6}"
            f" {pct('yes_no_answered_rate'):>9} {pct('yes_no_no_rate'):>9}  {types}"
        )
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
