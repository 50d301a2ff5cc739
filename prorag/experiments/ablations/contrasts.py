"""Primary contrasts, named before the run, and Holm-adjusted p-values for every contrast of a report.

A contrast is one arm tested against another, named ``"ARM - OTHER"`` (spaces around the dash, since
arm names hold dashes); the tested ones are each arm against the reference and each arm against its
control. A study names its primary contrasts before it runs; every other contrast is secondary.

Adjustment (:func:`with_holm`): Holm-Bonferroni, one family per test (per-question t, t over seeds,
permutation, non-yes/no, each step-validity rate) and per kind of contrast: the primary contrasts are
adjusted among themselves, the secondary ones among themselves. The tests of one contrast are readings
of the same runs, not new questions, so they are not pooled into one family. Each test gets ``p_holm``
beside its ``p_value``; a report prints the primaries' nominal p and marks them primary.

Default (:func:`default_primary`): each arm against the reference, except the arms that are some
arm's control: a control is there to explain an effect, not to be one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prorag.core.statistics import holm_adjust
from prorag.experiments.ablations.comparison import TEST_KINDS

#: How the two arms of a contrast's name are separated: a dash with spaces around it.
_SEPARATOR = re.compile(r"\s+-\s+")


def contrast_name(arm: str, other: str) -> str:
    """The name of ``arm`` tested against ``other``: ``"prorag - grpo"`` (positive: ``arm`` higher)."""
    return f"{arm} - {other}"


def parse_contrast(text: str) -> tuple[str, str]:
    """``"ARM - OTHER"`` as ``(ARM, OTHER)``. The dash needs a space on each side: arm names hold dashes
    (``prorag-oracle``), so ``"prorag-grpo"`` is refused rather than guessed."""
    parts = _SEPARATOR.split(text.strip())
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"contrast {text!r}: expected 'ARM - OTHER' (a dash with a space on each side), e.g. 'prorag - grpo'")
    return parts[0], parts[1]


def contrasts_of(arms: Iterable[str], reference: str, controls: Mapping[str, str]) -> list[str]:
    """The contrasts an arms comparison tests, in arm order: each arm against ``reference``, then each
    arm against its control (``controls``, arm -> control) where both are arms; each name once."""
    names = list(arms)
    out = [contrast_name(arm, reference) for arm in names if arm != reference and reference in names]
    out += [contrast_name(arm, controls[arm]) for arm in names if arm in controls and controls[arm] in names]
    return list(dict.fromkeys(out))


def default_primary(arms: Iterable[str], reference: str, controls: Mapping[str, str]) -> list[str]:
    """Each arm against ``reference``, leaving out the reference and every arm that is some arm's control."""
    names = list(arms)
    return [contrast_name(a, reference) for a in names if a != reference and a not in controls.values() and reference in names]


def check_primary(
    primary: Sequence[str], arms: Sequence[str], reference: str, controls: Mapping[str, str], where: str = "primary"
) -> list[str]:
    """``primary`` with each name in its canonical spelling, each once, in the order given; a name that
    is not ``'ARM - OTHER'``, names an arm that is not one, or a pair that is not tested (other than the
    reference or the arm's control) is refused with the contrasts that are tested."""
    testable = contrasts_of(arms, reference, controls)
    out: list[str] = []
    for text in primary:
        arm, other = parse_contrast(text)
        unknown = [name for name in (arm, other) if name not in arms]
        if unknown:
            raise ValueError(f"{where}: {text!r}: {', '.join(map(repr, unknown))} is not an arm (arms: {', '.join(arms)})")
        name = contrast_name(arm, other)
        if name not in testable:
            raise ValueError(
                f"{where}: {text!r} is not tested: an arm is tested against the reference ({reference}) and against "
                f"its control; the contrasts tested are {', '.join(testable) or '(none)'}"
            )
        if name not in out:
            out.append(name)
    return out


def pairs_with_tests(stats: Mapping[str, Mapping[str, Any]], reference: str) -> list[tuple[str, str]]:
    """The ``(arm, other)`` pairs that have a test in ``stats`` (:func:`process_statistics`'s), each once."""
    pairs = []
    for arm, row in stats.items():
        for other in (reference, row.get("control")):
            if other is not None and other != arm and any(f"vs_{other}{kind}" in row for kind in TEST_KINDS):
                pairs.append((arm, other))
    return list(dict.fromkeys(pairs))


def with_holm(stats: Mapping[str, Mapping[str, Any]], primary: Sequence[str], reference: str = "grpo") -> dict[str, Any]:
    """``stats`` with ``p_holm`` in every test (see the module docstring for the families); the input is
    left as it was. ``primary`` are canonical contrast names (:func:`check_primary`)."""
    out = {arm: dict(row) for arm, row in stats.items()}
    pairs = pairs_with_tests(stats, reference)
    for kind in TEST_KINDS:
        for is_primary in (True, False):
            keys = [
                (arm, f"vs_{other}{kind}")
                for arm, other in pairs
                if (contrast_name(arm, other) in primary) == is_primary and f"vs_{other}{kind}" in stats[arm]
            ]
            adjusted = holm_adjust([float(stats[arm][key]["p_value"]) for arm, key in keys])
            for (arm, key), p_holm in zip(keys, adjusted, strict=True):
                out[arm][key] = {**stats[arm][key], "p_holm": p_holm}
    return out


def primary_note(primary: Sequence[str] | None) -> str:
    """One sentence a report prints above its tests: which contrasts were primary and how the p-values
    beside the nominal ones were adjusted; ``""`` for results from before primaries were declared (``None``)."""
    if primary is None:
        return ""
    rest = (
        "every other contrast has its Holm-adjusted p beside the nominal one (over the other contrasts of this "
        "report, one test at a time)"
    )
    if not primary:
        return f"No primary contrast was named: {rest}."
    if len(primary) == 1:
        return f"Primary contrast, named before the run: {primary[0]} (nominal p); {rest}."
    return (
        f"Primary contrasts, named before the run: {', '.join(primary)} (nominal p, and Holm-adjusted among "
        f"these {len(primary)}); {rest}."
    )


def shows_holm(test: Mapping[str, Any], primary: bool, n_primary: int) -> bool:
    """Whether a report prints a test's ``p_holm`` beside its p: not for a test without one (results from
    before primaries were declared), nor for the one primary contrast (its nominal p is its own)."""
    return "p_holm" in test and not (primary and n_primary == 1)


def p_with_holm(test: Mapping[str, Any], p_text: str, primary: bool, n_primary: int) -> str:
    """A test's printed p (``p_text``) with its Holm-adjusted value beside it where :func:`shows_holm`:
    ``"0.044, Holm 0.131"``."""
    return f"{p_text}, Holm {float(test['p_holm']):.3f}" if shows_holm(test, primary, n_primary) else p_text
