"""The built-in world: build time per size, gold-page recall of BM25, and the memorisation audit.

    python benchmarks/world.py [--size demo] [--seed 0] [--out results.json]

Recall here is of each hop's gold page when the hop's template search keywords (the ``query``
of the gold decomposition, what the template teacher will write) are searched in the question's
own world, at k = 1, 2, 3, 5: the ceiling a policy that asks the right sub-queries can reach. Each
size's build time is also given as a ratio to the tiny world's, beside the ratio of their page counts
(a build that scales linearly has the two equal), with the machine it was measured on.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.core.metrics import retrieval_recall
from prorag.data.records import read_passages, read_records
from prorag.data.world import SIZES, build_world
from prorag.retrieval.bm25 import BM25Retriever

KS = (1, 2, 3, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="demo", choices=sorted(SIZES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict = {"machine": machine_name(), "build_seconds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            t0 = time.perf_counter()
            summary = build_world(Path(tmp) / size, seed=args.seed, size=size)
            results["build_seconds"][size] = time.perf_counter() - t0
            results.setdefault("counts", {})[size] = summary.counts
        tiny_seconds, tiny_pages = results["build_seconds"]["tiny"], results["counts"]["tiny"]["passages"]
        results["build_vs_tiny"] = {
            size: {"time": seconds / tiny_seconds, "pages": results["counts"][size]["passages"] / tiny_pages}
            for size, seconds in results["build_seconds"].items()
        }
        world = Path(tmp) / args.size
        passages = read_passages(world / "corpus.jsonl")
        t0 = time.perf_counter()
        bm25 = BM25Retriever(passages)
        results["bm25_build_seconds"] = time.perf_counter() - t0
        results["recall"] = {}
        for split in ("train", "test"):
            records = read_records(world / f"{split}.jsonl")
            queries, parts, golds, positions = [], [], [], []
            for r in records:
                for i, hop in enumerate(r.metadata["decomposition"]):
                    queries.append(hop["query"])
                    parts.append(r.partition)
                    golds.append(hop["doc_ids"])
                    positions.append(i + 1)
            t0 = time.perf_counter()
            hits = bm25.search(queries, k=max(KS), partitions=parts)
            qps = len(queries) / (time.perf_counter() - t0)
            by_pos: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            for h, g, pos in zip(hits, golds, positions, strict=True):
                ids = [x.id for x in h]
                for k in KS:
                    by_pos["all"][k].append(retrieval_recall(ids, g, k))
                    by_pos[f"hop{pos}"][k].append(retrieval_recall(ids, g, k))
            results["recall"][split] = {
                pos: {f"@{k}": sum(v) / len(v) for k, v in ks.items()} | {"n": len(ks[1])} for pos, ks in sorted(by_pos.items())
            }
            results["recall"][split]["queries_per_second"] = qps
        results["audit"] = json.loads((world / "world.json").read_text())["memorisation_audit"]["test"]

    print(f"on {results['machine']}")
    print("world build time: " + ", ".join(f"{s} {t:.2f}s" for s, t in results["build_seconds"].items()))
    print(
        "against the tiny world: "
        + ", ".join(f"{s} {r['time']:.1f}x the time for {r['pages']:.1f}x the pages" for s, r in results["build_vs_tiny"].items())
    )
    print(f"BM25 over the {args.size} world ({len(passages)} pages, partitioned) built in {results['bm25_build_seconds']:.2f}s")
    for split, rows in results["recall"].items():
        print(f"gold-page recall of template sub-queries, {split} ({rows['queries_per_second']:.0f} queries/s):")
        for pos, row in rows.items():
            if isinstance(row, dict):
                print(f"  {pos:<5} n={row['n']:<5} " + "  ".join(f"@{k} {row[f'@{k}']:.3f}" for k in KS))
    print("no-retrieval ceiling on test (EM):")
    for cat, row in results["audit"].items():
        print(f"  {cat:<14} n={row['n']:<4} best memoriser {row['best_memoriser_em']:.3f}  chance {row['chance']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
