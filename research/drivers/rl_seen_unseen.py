"""Where one pass of RL's updates show, if anywhere: greedy EM on the questions a run trained on, on
unseen questions of the same worlds, and on the held-out test worlds, each against pi_rft.

    python -m research.drivers.rl_seen_unseen RUN --arms prm-first-error-signed prm-first-error-signed-shuffled \\
        --seeds 0-4 --jobs 2 --out results/X.json

RUN is a pipeline run folder whose ``probes/ARM-sS/`` runs were made by `research/drivers/rl_seed_runs.sh`
(RL from pi_rft on the first ``limit`` questions of ``splits/rl.jsonl``, unscreened, one pass). Three
question sets, one ladder of distance from what the updates saw:

- ``seen``: those first ``limit`` questions, every one of which each run sampled and was pushed on
  once (the seed changes their order, not the set);
- ``unseen``: the next ``--unseen`` questions of ``splits/rl.jsonl``: the same twelve RL worlds (their
  entities and facts), questions no run trained on;
- ``test``: ``splits/test.jsonl``, other worlds (the runs' ``probes/test-ARM-sS-last`` evaluations).

A run that learned its training questions (memorised answers, or facts of its worlds) gains on
``seen`` more than on ``unseen``; one that learned to read gains on ``unseen`` and ``test`` too; one
whose updates are noise at this signal gains on none. pi_rft and every run's last checkpoint are
evaluated greedily (``prorag eval``, as the test evaluations were: ``--max-actions 11``) into
``probes/seen_unseen/`` unless already there, ``--jobs`` at a time, one torch thread each.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prorag.core.statistics import paired_t_test
from prorag.data.jsonl import read_json, read_jsonl, write_jsonl
from prorag.experiments.compare import parse_seeds
from research.analysis.results_file import write_results
from research.analysis.run_folder import evaluate, last_weights
from research.analysis.scores import evaluation, percent, pooled

SETS = ("seen", "unseen", "test")


def question_sets(run: Path, unseen: int) -> dict[str, Path]:
    """Write ``seen.jsonl`` and ``unseen.jsonl`` under ``probes/seen_unseen/`` from ``splits/rl.jsonl``
    and the RL runs' own ``limit``; return the three sets' files.

    The runs must agree on the questions they trained on: unscreened (``question_filter: none``, no
    ``exclude_ids_from``: the file's first ``limit`` questions, whatever the seed) and one ``limit``;
    anything else is refused, since a screened run's questions depend on its samples and ``seen``
    would not be what it saw."""
    configs = sorted((run / "probes").glob("*-s*/rl_config.json"))
    if not configs:
        raise FileNotFoundError(f"{run}/probes: no */rl_config.json (no RL runs to read the training set from)")
    limits = set()
    for path in configs:
        config = read_json(path)
        if config.get("question_filter", "none") != "none":
            raise ValueError(f"{path}: question_filter {config['question_filter']!r}; only unscreened runs train on a fixed set")
        if config.get("exclude_ids_from"):
            raise ValueError(f"{path}: exclude_ids_from is set, so its first `limit` questions are not the file's")
        limits.add(config.get("limit"))
    if len(limits) != 1 or None in limits:
        raise ValueError(f"{run}/probes: the runs' RL limits differ or are unset ({sorted(map(str, limits))}); expected one")
    limit = int(limits.pop())
    rows = list(read_jsonl(run / "splits" / "rl.jsonl"))
    if len(rows) < limit + unseen:
        raise ValueError(f"{run}/splits/rl.jsonl: {len(rows)} questions, fewer than limit {limit} + unseen {unseen}")
    out = run / "probes" / "seen_unseen"
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "seen.jsonl", rows[:limit])
    write_jsonl(out / "unseen.jsonl", rows[limit : limit + unseen])
    return {"seen": out / "seen.jsonl", "unseen": out / "unseen.jsonl", "test": run / "splits" / "test.jsonl"}


def run_scores(em: dict[str, str], base: dict[str, str]) -> dict[str, Any]:
    """One run's EM on each set and its difference from pi_rft (points), and the memorised part:
    the gain on ``seen`` minus the gain on ``unseen`` (same worlds, so the same kind of question)."""
    out: dict[str, Any] = {}
    for name, string in em.items():
        out[name] = round(percent(string), 2)
        out[f"{name}_diff"] = round(out[name] - percent(base[name]), 2)
    out["seen_minus_unseen_diff"] = round(out["seen_diff"] - out["unseen_diff"], 2)
    return out


def summarise(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every run's differences pooled: mean ± 95% CI over runs for each set, and the paired t-test of
    the seen gain against the unseen gain across runs (the runs share questions and some share a
    seed's stream, so read the p-value as descriptive)."""
    keys = [f"{s}_diff" for s in SETS] + ["seen_minus_unseen_diff"]
    values = {k: [r[k] for r in runs.values() if k in r] for k in keys}
    out: dict[str, Any] = {"runs": len(runs)}
    out.update({k: stats for k, v in values.items() if (stats := pooled(v)) is not None})
    if len(values["seen_diff"]) >= 2:
        test = paired_t_test(values["seen_diff"], values["unseen_diff"])
        out["seen_vs_unseen_p"] = round(test.p_value, 4)
    return out


def collect(run: Path, arms: list[str], seeds: list[int], unseen: int, jobs: int) -> dict[str, Any]:
    """Evaluate what is missing and return the results file's body."""
    files = question_sets(run, unseen)
    folder = run / "probes" / "seen_unseen"
    policies = {"pi_rft": run / "policies" / "rft" / "policy"}
    for arm in arms:
        for seed in seeds:
            if (run / "probes" / f"{arm}-s{seed}" / "policy").is_dir():  # policy/ is written at the run's end
                policies[f"{arm}-s{seed}"] = last_weights(run / "probes" / f"{arm}-s{seed}")
    tasks = [(name, s) for name in policies for s in ("seen", "unseen")]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(lambda t: evaluate(run, policies[t[0]], files[t[1]], folder / f"{t[0]}-{t[1]}"), tasks))
    for path in done:
        print(f"{path.name}: EM {read_json(path / 'metrics.json')['em']:.4f}", flush=True)
    ids = {s: [r["id"] for r in read_jsonl(files[s])] for s in SETS}

    def em_strings(name: str) -> dict[str, str]:
        tests = run / "eval" / "rft" if name == "pi_rft" else run / "probes" / f"test-{name}-last"
        strings = {s: evaluation(folder / f"{name}-{s}", ids[s])["em_by_question"] for s in ("seen", "unseen")}
        if (tests / "metrics.json").is_file():
            strings["test"] = evaluation(tests, ids["test"])["em_by_question"]
        return strings

    base = em_strings("pi_rft")
    if "test" not in base:
        raise FileNotFoundError(f"{run}/eval/rft/metrics.json: pi_rft's test evaluation is needed as the base")
    runs = {
        name: {"checkpoint": path.name, **run_scores(em_strings(name), base)}
        for name, path in policies.items()
        if name != "pi_rft"
    }
    by_arm = {arm: summarise({k: v for k, v in runs.items() if k.rsplit("-s", 1)[0] == arm}) for arm in arms}
    return {
        "sets": {s: {"file": str(files[s]), "n": len(ids[s])} for s in SETS},
        "pi_rft": {s: round(percent(base[s]), 2) for s in SETS},
        "runs": runs,
        "by_arm": by_arm,
        "all_runs": summarise(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the pipeline run folder (its probes/ holds the RL runs)")
    parser.add_argument("--arms", nargs="+", required=True, help="arms: their probes/ARM-sS folder names")
    parser.add_argument("--seeds", required=True, help="0-4, 0,2,5 or 0-2,5 (seeds without a finished run are skipped)")
    parser.add_argument("--unseen", type=int, default=200, help="questions after the training set, same worlds")
    parser.add_argument("--jobs", type=int, default=1, help="evaluations at a time (one torch thread each)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.jobs < 1 or args.unseen < 2:
        parser.error("--jobs must be >= 1 and --unseen >= 2")
    body = collect(args.run, args.arms, parse_seeds(args.seeds), args.unseen, args.jobs)
    write_results(args.out, body)
    print("pi_rft EM: " + ", ".join(f"{s} {v:.2f}" for s, v in body["pi_rft"].items()))
    for name, r in body["runs"].items():
        print(f"{name}: " + ", ".join(f"{s} {r[s]:.2f} ({r[s + '_diff']:+.2f})" for s in SETS if s in r))
    for label, summary in [*body["by_arm"].items(), ("all runs", body["all_runs"])]:
        parts = [f"{k[:-5]} {v['mean']:+.2f} ± {v['ci95']:.2f}" for k, v in summary.items() if isinstance(v, dict)]
        print(f"{label} ({summary['runs']} runs), over pi_rft: " + "; ".join(parts))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
