"""Where a policy's steps go wrong, per system of a run folder: the oracle's verdict on every step
of its evaluated trajectories (``RUN/eval/SYSTEM/trajectories.jsonl``), counted by kind
(:mod:`prorag.evaluation.step_errors`): valid searches, valid sub-answers, and of the wrong
sub-answers those written next to documents that held a gold sub-answer (reading errors) and
those that copied another span of them; answers right and worked out. Questions with gold
decompositions only (the built-in world, MuSiQue).

    python -m research.drivers.step_errors RUN rft grpo-seed0 prorag-oracle-seed0 [--json OUT.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prorag.data.jsonl import read_jsonl, write_json
from prorag.data.records import read_records
from prorag.evaluation.step_errors import step_error_counts


def share(num: int, den: int) -> str:
    return f"{100 * num / den:5.1f}%" if den else "    -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a pipeline run folder (world/, policies/, eval/)")
    parser.add_argument("systems", nargs="+", help="names under RUN/eval/")
    parser.add_argument("--split", default="test", help="the records file under RUN/world/ (default test)")
    parser.add_argument("--tokenizer", type=Path, help="default: RUN/policies/sft/policy")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer or args.run / "policies" / "sft" / "policy"))
    records = {r.id: r for r in read_records(args.run / "world" / f"{args.split}.jsonl")}
    print(
        f"{'system':22s} {'searches':>9s} {'valid':>6s} {'sub-ans':>8s} {'valid':>6s} "
        f"{'wrong, gold in docs':>20s} {'wrong, copied':>14s} {'answers valid':>14s}"
    )
    out = {}
    for system in args.systems:
        rows = read_jsonl(args.run / "eval" / system / "trajectories.jsonl")
        c = step_error_counts((records[r["id"]], tokenizer.decode(r["completion_ids"])) for r in rows)
        wrong = c["conclude"] - c["conclude_valid"]
        print(
            f"{system:22s} {c['search']:9d} {share(c['search_valid'], c['search'])} {c['conclude']:8d} "
            f"{share(c['conclude_valid'], c['conclude'])} {share(c['conclude_wrong_gold_in_documents'], wrong):>20s} "
            f"{share(c['conclude_wrong_copied_from_documents'], wrong):>14s} {share(c['answer_valid'], c['answer']):>14s}"
        )
        out[system] = dict(c)
    if args.json:
        write_json(args.json, {"run": str(args.run), "split": args.split, "counts": out})
        print(f"-> {args.json}")
    print("unpaired trajectories (left out): " + ", ".join(f"{s} {v.get('unpaired', 0)}" for s, v in out.items()))


if __name__ == "__main__":
    main()
