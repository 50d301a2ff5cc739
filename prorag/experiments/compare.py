"""Arms compared from their evaluation folders: the process ablation's statistics for runs made
one by one (``prorag rl`` and ``prorag eval`` per arm and seed, on a cluster or in a shell loop).

``prorag ablate --what process`` trains, evaluates and compares in one command. Studies that outgrow
it (arms added a session later, seeds spread over machines, runs started from a policy the pipeline
did not build) end with a folder of evaluations per arm and seed, and the same question: per-seed EM
of each arm, mean ± 95% CI over seeds, and each arm against a reference and against its control,
paired by seed. This module reads those folders and hands them to the very function the ablation
uses (:func:`~prorag.experiments.ablations.process_statistics`), so the two report the same numbers.
Primary contrasts (``--primary``, default each arm against the reference but the controls) are
reported with their nominal p-values; every other test carries a Holm-adjusted ``p_holm``
(:mod:`~prorag.experiments.ablations.contrasts`). Name them before the runs: chosen after seeing the
numbers they are not primary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prorag.experiments.ablations import PROCESS_METRICS, process_statistics, read_evaluation
from prorag.experiments.ablations.contrasts import check_primary, default_primary, with_holm

#: The placeholder an arm's folder pattern must hold: each seed's folder is the pattern with it replaced.
SEED_FIELD = "{seed}"


def parse_seeds(text: str) -> list[int]:
    """Seeds from ``"0-4"``, ``"0,2,5"`` or a mix (``"0-2,5"``), in the order given, each once.

    Ranges are inclusive, as people say them ("seeds 0 to 4"). Anything else is refused with the
    piece that did not parse, since a silently dropped seed changes every interval."""
    seeds: list[int] = []
    for piece in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if match is None:
            raise ValueError(f"--seeds: {piece!r} is not a seed or a range like 0-4 (in {text!r})")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise ValueError(f"--seeds: the range {piece!r} runs backwards")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    return seeds


def parse_pairs(items: Sequence[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` items (``--arm``, ``--control``) as a dict, in the order given; a missing ``=``,
    an empty side or a name given twice is refused with the item and the option named."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"{option}: expected NAME=VALUE, got {item!r}")
        if name in out:
            raise ValueError(f"{option}: {name!r} is given twice")
        out[name] = value
    return out


def evaluation_folder(pattern: str, seed: int) -> Path:
    """The evaluation folder of one seed: ``pattern`` with ``{seed}`` replaced. A pattern may name the
    folder or its ``predictions.jsonl``; the folder is returned either way."""
    path = Path(pattern.replace(SEED_FIELD, str(seed)))
    return path.parent if path.name == "predictions.jsonl" else path


def compare_arms(
    arms: Mapping[str, str],
    seeds: Sequence[int],
    reference: str | None = None,
    controls: Mapping[str, str] | None = None,
    metrics: Sequence[str] = PROCESS_METRICS,
    primary: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Read every arm's evaluation folder per seed and compare the arms.

    ``arms`` maps an arm's name to its folder pattern (``probes/test-grpo-s{seed}``); a seed whose
    folder has no ``predictions.jsonl`` is left out of that arm and listed under ``missing`` (studies
    finish seeds unevenly; the tests over seeds pair only the seeds both arms have), but an arm needs
    two seeds, since one has no interval. ``reference`` (default: the first arm) is the arm every
    other is tested against; ``controls`` adds each arm's test against its control (arm -> control).
    ``metrics`` are read per seed from ``metrics.json`` where the evaluation wrote one (step
    validity, searches), reported as mean ± 95% CI. ``primary``: the contrasts named primary
    (``"ARM - OTHER"``, OTHER the reference or ARM's control; None: each arm against the reference but
    the controls), checked before any folder is read. Returns ``{"arms", "seeds", "missing",
    "reference", "controls", "primary", "stats"}``, ``stats`` as :func:`process_statistics` gives them,
    with ``p_holm`` beside every test's ``p_value``."""
    if len(arms) < 2:
        raise ValueError(f"compare needs at least two arms (--arm NAME=PATTERN), got {len(arms)}")
    for name, pattern in arms.items():
        if SEED_FIELD not in pattern:
            raise ValueError(f"--arm {name}: the pattern {pattern!r} has no {SEED_FIELD}, so every seed would be one folder")
    reference = reference if reference is not None else next(iter(arms))
    if reference not in arms:
        raise ValueError(f"--reference {reference!r} is not an arm (arms: {', '.join(arms)})")
    for arm, control in (controls or {}).items():
        unknown = [name for name in (arm, control) if name not in arms]
        if unknown:
            raise ValueError(
                f"--control {arm}={control}: {', '.join(map(repr, unknown))} is not an arm (arms: {', '.join(arms)})"
            )
    names = list(arms)
    chosen = (
        default_primary(names, reference, controls or {})
        if primary is None
        else check_primary(primary, names, reference, controls or {}, where="--primary")
    )
    predictions: dict[str, dict[int, list[dict[str, Any]]]] = {}
    extras: dict[str, dict[int, dict[str, float | None]]] = {}
    found: dict[str, list[int]] = {}
    missing: dict[str, list[int]] = {}
    for arm, pattern in arms.items():
        predictions[arm], extras[arm] = {}, {}
        for seed in seeds:
            folder = evaluation_folder(pattern, seed)
            if not (folder / "predictions.jsonl").is_file():
                missing.setdefault(arm, []).append(seed)
                continue
            predictions[arm][seed], extras[arm][seed] = read_evaluation(folder, metrics)
        found[arm] = sorted(predictions[arm])
        if len(found[arm]) < 2:
            raise ValueError(
                f"--arm {arm}: {len(found[arm])} of seeds {list(seeds)} have {pattern}/predictions.jsonl; "
                "a 95% CI over seeds needs at least 2"
            )
    return {
        "arms": dict(arms),
        "seeds": found,
        "missing": missing,
        "reference": reference,
        "controls": dict(controls or {}),
        "primary": chosen,
        "stats": with_holm(
            process_statistics(predictions, reference=reference, extras=extras, controls=controls), chosen, reference
        ),
    }
