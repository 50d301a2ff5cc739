"""Retrieval over the pooled real benchmark corpus: build cost, gold recall, throughput, HTTP overhead.

    python benchmarks/retrieval.py [--shared PATH] [--skip-dense] [--out results.json] [--work DIR]

The corpus pools the context paragraphs of every file under ``<shared>/data/benchmarks``
(about 25k Wikipedia paragraphs). It is closed-world and much easier than a full Wikipedia
dump: report its numbers as "pooled benchmark corpus", never next to wiki-18 results.

For BM25 and (unless ``--skip-dense``) the bundled all-MiniLM-L6-v2 it prints:

* index build time (``prorag index``'s ``build_index``, including saving) and the growth of
  this process's resident memory during the build (for dense, that includes loading torch and
  the model), and the peak where the kernel lets us reset the high-water mark;
* recall@{1,3,5} of the gold supporting paragraphs on HotpotQA dev (1,100 questions) and
  MuSiQue-Ans dev (200), the question itself as the query;
* queries/s at batch 1 and batch 64 (k=3; best of 5 passes), in-process and through ``prorag serve-retriever``
  started in a subprocess on a free loopback port, and the server/in-process latency ratio at
  batch 64 (target: < 1.3), and BM25's batched throughput against the 500 queries/s target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from machine import cpu_name  # benchmarks/machine.py, beside this file

from prorag.core.metrics import retrieval_recall
from prorag.data.benchmarks import load_benchmark
from prorag.data.corpus import build_corpus
from prorag.data.jsonl import write_jsonl
from prorag.data.records import Record
from prorag.retrieval.base import Retriever
from prorag.retrieval.client import HttpRetriever
from prorag.retrieval.index import build_index, load_index, read_manifest

KS = (1, 3, 5)
THROUGHPUT_K = 3
REPEATS = 5
BM25_TARGET_QPS = 500.0
SERVER_OVERHEAD_TARGET = 1.30
#: Queries timed at batch 1 (per kind: dense is ~100x slower per query than BM25).
BATCH1_QUERIES = {"bm25": 1300, "dense": 200}
DEV_SETS = {  # name -> (files under benchmarks/, format)
    "hotpotqa": (
        ["hotpotqa/hotpot_dev_hard_a.jsonl", "hotpotqa/hotpot_dev_hard_b.jsonl", "hotpotqa/hotpot_dev_hard_c.jsonl"],
        "hotpotqa",
    ),
    "musique": (["musique/musique_ans_dev_200.jsonl"], "musique"),
}


# ----------------------------------------------------------------------------- memory


def _status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` field in kB (Linux), else None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def rss_mb() -> float:
    """Current resident set size; ``ru_maxrss`` (the peak) where /proc is missing."""
    kb = _status_kb("VmRSS")
    if kb is None:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
    return kb / 1024


def reset_peak() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM); False if not allowed here."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ----------------------------------------------------------------------------- data


def pooled_corpus(bench_dir: Path, out: Path) -> dict[str, Any]:
    """Pool every benchmark file's paragraphs into ``out``; return counts."""
    files = sorted(p for p in bench_dir.rglob("*") if p.suffix in {".json", ".jsonl"})
    t0 = time.perf_counter()
    built = build_corpus(files)
    seconds = time.perf_counter() - t0
    write_jsonl(out, (p.to_dict() for p in built.passages))
    return {"files": len(files), "passages": len(built.passages), "duplicates": built.duplicates, "seconds": seconds}


def dev_questions(bench_dir: Path) -> dict[str, list[Record]]:
    """The dev records of each set, keeping those with gold paragraph ids."""
    out = {}
    for name, (files, fmt) in DEV_SETS.items():
        records = [r for f in files for r in load_benchmark(bench_dir / f, fmt).records]
        out[name] = [r for r in records if r.metadata.get("gold_doc_ids")]
    return out


# ----------------------------------------------------------------------------- measurements


def measure_build(corpus: Path, out: Path, kind: str) -> dict[str, Any]:
    """Build and save an index; time and memory of this process while doing it."""
    peak_ok = reset_peak()
    before = rss_mb()
    info = build_index(corpus, out, kind=kind)
    after = rss_mb()
    peak = _status_kb("VmHWM")
    return {
        "build_seconds": info["build_seconds"],
        "rss_growth_mb": after - before,
        "peak_growth_mb": (peak / 1024 - before) if peak_ok and peak is not None else None,
        "index_mb": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20,
        "load_avg": os.getloadavg()[0],
    }


def recall(retriever: Retriever, records: Sequence[Record]) -> dict[str, float]:
    """Mean recall@k of the gold paragraphs, each question searched as it is."""
    hits = retriever.search([r.question for r in records], k=max(KS))
    ids = [[h.id for h in row] for row in hits]
    return {
        f"@{k}": sum(retrieval_recall(i, r.metadata["gold_doc_ids"], k) for i, r in zip(ids, records, strict=True)) / len(records)
        for k in KS
    } | {"n": len(records)}


def throughput(retriever: Retriever, queries: Sequence[str], batch: int) -> dict[str, float]:
    """Queries/s and mean latency of one ``search`` call at the given batch size.

    The best of :data:`REPEATS` passes: on a shared machine other jobs only ever slow a pass
    down, so the fastest one is the closest to the code's own cost. The 1-minute load
    average before the passes is kept, to show how busy the machine was.
    """
    retriever.search(list(queries[:batch]), k=THROUGHPUT_K)  # warm-up (dense: loads the model)
    batches = [list(queries[i : i + batch]) for i in range(0, len(queries), batch)]
    load = os.getloadavg()[0]
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for b in batches:
            retriever.search(b, k=THROUGHPUT_K)
        best = min(best, time.perf_counter() - t0)
    return {"qps": len(queries) / best, "ms_per_call": 1000 * best / len(batches), "queries": len(queries), "load_avg": load}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(index_dir: Path, log_path: Path) -> Iterator[str]:
    """``prorag serve-retriever`` in a subprocess; yields its URL once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "prorag.cli", "serve-retriever", "--index", str(index_dir), "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not healthy after 300 s:\n{log_path.read_text()}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def reused_build(index_dir: Path, num_passages: int) -> dict[str, Any] | None:
    """The build numbers of an index kept by an earlier run with ``--work``, if it fits the corpus."""
    with contextlib.suppress(Exception):
        manifest = read_manifest(index_dir)
        if manifest["num_passages"] == num_passages:
            return {"build_seconds": manifest["build_seconds"], "rss_growth_mb": None, "peak_growth_mb": None,
                    "index_mb": sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file()) / 2**20,
                    "load_avg": None, "reused": True}  # fmt: skip
    return None


def benchmark_kind(kind: str, corpus: Path, work: Path, questions: dict[str, list[Record]], num_passages: int) -> dict[str, Any]:
    """Every measurement for one index kind."""
    index_dir = work / kind
    build = reused_build(index_dir, num_passages)
    if build is None:
        print(f"[{kind}] building the index ...", flush=True)
        build = measure_build(corpus, index_dir, kind)
    else:
        print(f"[{kind}] reusing the index in {index_dir} (memory not measured)", flush=True)
    result: dict[str, Any] = {"build": build}
    retriever = load_index(index_dir)
    print(f"[{kind}] recall ...", flush=True)
    result["recall"] = {name: recall(retriever, records) for name, records in questions.items()}
    queries = [r.question for records in questions.values() for r in records]
    one = queries[: BATCH1_QUERIES[kind]]
    print(f"[{kind}] in-process throughput ...", flush=True)
    result["in_process"] = {"batch1": throughput(retriever, one, 1), "batch64": throughput(retriever, queries, 64)}
    print(f"[{kind}] server throughput ...", flush=True)
    with running_server(index_dir, work / f"{kind}-server.log") as url, HttpRetriever(url, batch_size=64) as remote:
        same = [[h.id for h in hits] for hits in remote.search(queries[:64], k=THROUGHPUT_K)]
        if same != [[h.id for h in hits] for hits in retriever.search(queries[:64], k=THROUGHPUT_K)]:
            raise RuntimeError(f"the {kind} server's results differ from the in-process ones")
        result["server"] = {"batch1": throughput(remote, one, 1), "batch64": throughput(remote, queries, 64)}
    result["server_over_in_process_batch64"] = (
        result["server"]["batch64"]["ms_per_call"] / result["in_process"]["batch64"]["ms_per_call"]
    )
    return result


# ----------------------------------------------------------------------------- report


def print_report(results: dict[str, Any]) -> None:
    c = results["corpus"]
    print(f"\npooled benchmark corpus: {c['passages']} passages from {c['files']} files "
          f"({c['duplicates']} duplicates dropped, pooled in {c['seconds']:.1f}s); {results['machine']}")  # fmt: skip
    kinds = [k for k in ("bm25", "dense") if k in results]
    rows: list[tuple[str, ...]] = []

    def row(label: str, fn: Any) -> None:
        rows.append((label, *(fn(results[k]) for k in kinds)))

    def opt_mb(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.0f} MB"

    row("build time (incl. save)", lambda r: f"{r['build']['build_seconds']:.1f} s")
    row("RSS growth during build", lambda r: opt_mb(r["build"]["rss_growth_mb"]))
    row("peak RSS growth during build", lambda r: opt_mb(r["build"]["peak_growth_mb"]))
    row("index size on disk", lambda r: f"{r['build']['index_mb']:.0f} MB")
    for name in DEV_SETS:
        for k in KS:
            row(f"recall@{k} {name} dev (n={results[kinds[0]]['recall'][name]['n']})",
                lambda r, name=name, k=k: f"{r['recall'][name][f'@{k}']:.3f}")  # fmt: skip
    for where in ("in_process", "server"):
        for batch in ("batch1", "batch64"):
            row(f"q/s {where.replace('_', '-')} {batch}",
                lambda r, w=where, b=batch: f"{r[w][b]['qps']:.0f} ({r[w][b]['ms_per_call']:.1f} ms/call)")  # fmt: skip
    row("server / in-process latency @64", lambda r: f"{r['server_over_in_process_batch64']:.2f}x")
    row("load average while timing (max)",
        lambda r: f"{max(r[w][b]['load_avg'] for w in ('in_process', 'server') for b in ('batch1', 'batch64')):.1f}")  # fmt: skip
    widths = [max(len(r[i]) for r in [("", *kinds), *rows]) for i in range(len(kinds) + 1)]
    for r in [("", *kinds), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    print()
    for verdict in results["targets"].values():
        print(verdict["text"])


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "bm25" in results:
        qps = results["bm25"]["in_process"]["batch64"]["qps"]
        out["bm25_batch64_qps"] = {"value": qps, "target": BM25_TARGET_QPS, "met": qps >= BM25_TARGET_QPS,
                                   "text": f"BM25 batched in-process: {qps:.0f} q/s vs target {BM25_TARGET_QPS:.0f} q/s: "
                                           f"{'met' if qps >= BM25_TARGET_QPS else 'NOT met'}"}  # fmt: skip
    for kind in ("bm25", "dense"):
        if kind in results:
            ratio = results[kind]["server_over_in_process_batch64"]
            ok = ratio < SERVER_OVERHEAD_TARGET
            out[f"{kind}_server_overhead"] = {
                "value": ratio, "target": SERVER_OVERHEAD_TARGET, "met": ok,
                "text": f"{kind} server adds {100 * (ratio - 1):+.0f}% to batch-64 latency "
                        f"(target < {100 * (SERVER_OVERHEAD_TARGET - 1):.0f}%): {'met' if ok else 'NOT met'}",
            }  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared",
                    help="the shared folder (holding data/benchmarks)")  # fmt: skip
    ap.add_argument("--skip-dense", action="store_true", help="BM25 only (dense encoding takes minutes on CPU)")
    ap.add_argument("--out", type=Path, default=None, help="write the numbers to this JSON file")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the corpus and indexes here and reuse them on the next run (default: a temporary folder)")  # fmt: skip
    args = ap.parse_args()
    bench_dir = args.shared / "data" / "benchmarks"
    if not bench_dir.is_dir():
        sys.exit(f"no benchmark data at {bench_dir}; pass --shared")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    results: dict[str, Any] = {
        "machine": f"{cpu_name()}, {platform.machine()}, {cores} CPU cores, Python {platform.python_version()}"
    }
    with tempfile.TemporaryDirectory(prefix="prorag-retrieval-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results["corpus"] = pooled_corpus(bench_dir, work / "corpus.jsonl")
        questions = dev_questions(bench_dir)
        for kind in ("bm25",) if args.skip_dense else ("bm25", "dense"):
            results[kind] = benchmark_kind(kind, work / "corpus.jsonl", work, questions, results["corpus"]["passages"])
    results["targets"] = targets(results)
    print_report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
