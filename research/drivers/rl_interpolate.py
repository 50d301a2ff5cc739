"""A shorter step along each RL run's own update, and the average of several runs' updates: do they keep
what the update buys and pay less of what it costs?

    python -m research.drivers.rl_interpolate RUN --runs outcome-grpo-s0 outcome-grpo-s1 --scale 0.5 \\
        --soup all=outcome-grpo-s0,outcome-grpo-s1 --jobs 2 --out results/X.json

RUN is a pipeline run folder whose ``probes/NAME/`` RL runs started from ``policies/rft/policy`` and
whose seen/unseen evaluations exist (``research/drivers/rl_seen_unseen.py``). ``research/drivers/rl_update_noise.py``
splits a run's change into a linear part (its direction's worth) and a quadratic part (the cost of a step
of its size); where the second outweighs the first, a step of ``--scale`` times the update (pi_rft +
scale x delta: the weight-space interpolation of WiSE-FT, whose default is 0.5) keeps ``scale`` of the
first and ``scale^2`` of the second. A soup (``--soup NAME=RUN,RUN,...``: pi_rft plus the mean of the
runs' updates) keeps what the runs share and divides what each run's samples added alone by their number.

Every interpolated run and every soup is evaluated greedily (``prorag eval --max-actions 11``) on each
of ``--sets`` (``seen``, ``unseen``: ``probes/seen_unseen/``; ``test``: ``splits/test.jsonl``; ``dev``:
``splits/dev.jsonl``) into ``probes/interpolate/``; what exists is kept. Reported: EM of pi_rft, of each
run (its last weights) and of each interpolation, the interpolation's gain over pi_rft and over its run,
pooled over runs (mean ± 95% CI, t over runs, with the share above 0), and each soup's gain over pi_rft
with a paired t-test over questions. Nothing is chosen on test: the scale is set beforehand.
``--include LABEL=REGEX`` keeps, of each run's update (not the soups'), only the tensors whose names match
(e.g. ``embed=embed_tokens|model\\.norm``; the policies are ``NAME-aSCALE-LABEL``, and ``--scale 1`` is
allowed with it): where in the network the update's worth and its cost lie.
"""

from __future__ import annotations

import argparse
import functools
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from prorag.core.statistics import paired_t_test
from prorag.data.jsonl import read_jsonl
from research.analysis.results_file import write_results
from research.analysis.run_folder import WEIGHTS, evaluate, last_weights, write_policy
from research.analysis.scores import evaluation, percent, pooled
from research.analysis.update_noise import apply_delta, mean_delta, update_delta

SET_NAMES = ("seen", "unseen", "test", "dev")


def set_files(run: Path) -> dict[str, Path]:
    folder = run / "probes" / "seen_unseen"
    return {
        "seen": folder / "seen.jsonl",
        "unseen": folder / "unseen.jsonl",
        "test": run / "splits" / "test.jsonl",
        "dev": run / "splits" / "dev.jsonl",
    }


def known_evaluation(run: Path, name: str, which: str) -> Path | None:
    """The folder of an evaluation the earlier drivers already made (pi_rft's or a run's last
    weights on ``which``), or None where there is none (dev: RL's own dev curve is not per question)."""
    if which == "test":
        return run / "eval" / "rft" if name == "pi_rft" else run / "probes" / f"test-{name}-last"
    if which in ("seen", "unseen"):
        return run / "probes" / "seen_unseen" / f"{name}-{which}"
    return None


def restrict(delta: dict[str, Any], pattern: str | None) -> dict[str, Any]:
    """``delta`` with every tensor whose name does not match ``pattern`` (``re.search``) set to zero."""
    if pattern is None:
        return delta
    kept = {name: t if re.search(pattern, name) else t.new_zeros(t.shape) for name, t in delta.items()}
    if not any(re.search(pattern, name) for name in delta):
        raise ValueError(f"--include: no tensor name matches {pattern!r} (names look like {next(iter(delta))!r})")
    return kept


def collect(
    run: Path,
    names: list[str],
    scale: float,
    soups: dict[str, list[str]],
    sets: list[str],
    jobs: int,
    include: tuple[str, str] | None = None,
) -> dict[str, Any]:
    files = set_files(run)
    for which in sets:
        if not files[which].is_file():
            raise FileNotFoundError(f"{files[which]}: missing (seen/unseen come from research/drivers/rl_seen_unseen.py)")
    ids = {s: [r["id"] for r in read_jsonl(files[s])] for s in sets}
    folder = run / "probes" / "interpolate"
    base_policy = run / "policies" / "rft" / "policy"
    initial = load_file(str(base_policy / WEIGHTS))
    members = sorted({m for ms in soups.values() for m in ms} | set(names))
    finals = {name: last_weights(run / "probes" / name) for name in members}
    deltas = {name: update_delta(initial, load_file(str(path / WEIGHTS))) for name, path in finals.items()}
    tag = f"a{scale:g}" + (f"-{include[0]}" if include else "")
    pattern = include[1] if include else None

    policies: dict[str, Path] = {}
    for name in names:
        policies[f"{name}-{tag}"] = write_policy(
            base_policy, apply_delta(initial, restrict(deltas[name], pattern), scale), folder / f"{name}-{tag}"
        )
    for soup, runs in soups.items():
        policies[f"soup-{soup}"] = write_policy(
            base_policy, apply_delta(initial, mean_delta([deltas[r] for r in runs])), folder / f"soup-{soup}"
        )
    # the references the earlier drivers did not make: pi_rft and each run on the sets they skipped
    references = {"pi_rft": base_policy, **{name: finals[name] for name in names}}
    tasks = [(p, s) for p in policies for s in sets]
    tasks += [(r, s) for r in references for s in sets if known_evaluation(run, r, s) is None]
    every = {**policies, **references}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda t: evaluate(run, every[t[0]], files[t[1]], folder / f"{t[0]}-{t[1]}"), tasks))

    @functools.cache
    def em(name: str, which: str) -> str:  # cached: a soup's members and each run are read more than once
        where = known_evaluation(run, name, which) if name in references or name in finals else None
        return evaluation(where or folder / f"{name}-{which}", ids[which])["em_by_question"]

    base = {s: em("pi_rft", s) for s in sets}
    out_runs: dict[str, Any] = {}
    for name in names:
        row: dict[str, Any] = {}
        for which in sets:
            own, short = em(name, which), em(f"{name}-{tag}", which)
            row[which] = {
                "run": round(percent(own), 2),
                tag: round(percent(short), 2),
                "gain_over_pi_rft": round(percent(short) - percent(base[which]), 2),
                "gain_over_run": round(percent(short) - percent(own), 2),
                "run_over_pi_rft": round(percent(own) - percent(base[which]), 2),
            }
        out_runs[name] = row
    out_soups: dict[str, Any] = {}
    for soup, runs in soups.items():
        row = {"runs": runs}
        for which in sets:
            string = em(f"soup-{soup}", which)
            scores = [float(c) for c in string]
            test = paired_t_test(scores, [float(c) for c in base[which]])
            known = all(known_evaluation(run, r, which) is not None or r in references for r in runs)
            members_mean = sum(percent(em(r, which)) for r in runs) / len(runs) if known else None
            row[which] = {
                "em": round(percent(string), 2),
                "gain_over_pi_rft": round(percent(string) - percent(base[which]), 2),
                "p_per_question": round(test.p_value, 4),
                "members_mean": round(members_mean, 2) if members_mean is not None else None,
            }
        out_soups[soup] = row
    summary = {
        which: {
            key: pooled([r[which][key] for r in out_runs.values()])
            for key in ("gain_over_pi_rft", "gain_over_run", "run_over_pi_rft")
        }
        for which in sets
    }
    return {
        "scale": scale,
        "include": {"label": include[0], "pattern": include[1]} if include else None,
        "pi_rft": {s: round(percent(base[s]), 2) for s in sets},
        "sets": {s: {"file": str(files[s]), "n": len(ids[s])} for s in sets},
        "runs": out_runs,
        "soups": out_soups,
        "summary": summary,
    }


def parse_soup(text: str) -> tuple[str, list[str]]:
    name, _, runs = text.partition("=")
    members = [r for r in runs.split(",") if r]
    if not name or len(members) < 2:
        raise argparse.ArgumentTypeError(f"--soup: expected NAME=RUN,RUN[,...] (two runs or more), got {text!r}")
    return name, members


def parse_include(text: str) -> tuple[str, str]:
    label, _, pattern = text.partition("=")
    if not re.fullmatch(r"[A-Za-z0-9_]+", label) or not pattern:
        raise argparse.ArgumentTypeError(f"--include: expected LABEL=REGEX (LABEL letters, digits, _), got {text!r}")
    re.compile(pattern)
    return label, pattern


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the pipeline run folder (its probes/ holds the RL runs)")
    parser.add_argument("--runs", nargs="*", default=[], help="RL run folders under probes/ to interpolate, e.g. outcome-grpo-s0")
    parser.add_argument("--scale", type=float, default=0.5, help="the step along each update (0 < scale <= 1)")
    parser.add_argument(
        "--include",
        type=parse_include,
        default=None,
        help="LABEL=REGEX: step only along the tensors whose names match (the rest of each update is dropped)",
    )
    parser.add_argument("--soup", type=parse_soup, action="append", default=[], help="NAME=RUN,RUN,... (repeatable)")
    parser.add_argument("--sets", nargs="+", default=["unseen", "test"], choices=SET_NAMES)
    parser.add_argument("--jobs", type=int, default=1, help="evaluations at a time (one torch thread each)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not 0 < args.scale <= 1 or (args.scale == 1 and args.include is None):
        parser.error(f"--scale must be in (0, 1), or 1 with --include, got {args.scale}")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if not args.runs and not args.soup:
        parser.error("nothing to do: give --runs, --soup or both")
    soups = dict(args.soup)
    body = collect(args.run, args.runs, args.scale, soups, args.sets, args.jobs, args.include)
    write_results(args.out, body)
    tag = f"a{args.scale:g}" + (f"-{args.include[0]}" if args.include else "")
    print("pi_rft EM: " + ", ".join(f"{s} {v:.2f}" for s, v in body["pi_rft"].items()))
    for name, row in body["runs"].items():
        print(
            f"{name}: "
            + "; ".join(f"{s} run {r['run']:.2f} {tag} {r[tag]:.2f} ({r['gain_over_pi_rft']:+.2f})" for s, r in row.items())
        )
    for which, parts in body["summary"].items():
        print(
            f"{which}: "
            + "; ".join(f"{k} {v['mean']:+.2f} ± {v['ci95']:.2f} ({v['positive']}/{v['n']} > 0)" for k, v in parts.items() if v)
        )
    for soup, row in body["soups"].items():
        print(
            f"soup {soup} ({len(row['runs'])} runs): "
            + "; ".join(
                f"{s} {r['em']:.2f} ({r['gain_over_pi_rft']:+.2f}, p {r['p_per_question']:.3f})"
                for s, r in row.items()
                if s != "runs"
            )
        )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
