"""The arms of the arms ablations (``process``, ``family``): what each is, and the checks made before any runs.

An arm is a list of ``rl.*`` assignments (``--set`` syntax) on top of outcome-only GRPO from pi_rft, so
a new method joins a comparison with one line and its arm reads as the command that runs it. A config
adds arms without code (``extra_arms``), the pair each is tested against beside GRPO (``arm_controls``)
and the contrasts that are primary (``primary_contrasts``); :func:`ablation_arms` checks all of it
before an ablation runs for hours. The ``grpo`` and ``prorag`` arms have exactly the pipeline systems'
configs, so they reuse those runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prorag.core.config import apply_overrides, parse_assignment
from prorag.experiments.ablations.contrasts import check_primary, default_primary
from prorag.experiments.ablations.runs import dpo_policy
from prorag.experiments.pipeline import PipelineConfig, Run, rl_config, rl_dev_file, rl_replay
from prorag.experiments.stream_control import FROZEN_ARM

#: An arm: ``rl.*`` assignments (``--set`` syntax, the ``rl.`` prefix left out) applied to
#: outcome-only GRPO from pi_rft; a ``process_reward`` other than ``none`` also turns on the
#: config's beta and the PRM path (:func:`arm_config`).
Arm = tuple[str, ...]
#: The arm every other arm is tested against: outcome-only GRPO.
REFERENCE = "grpo"
#: The arms of the process ablation. ``grpo`` and ``prorag`` are the pipeline's systems (their
#: runs are reused).
PROCESS_ARMS: dict[str, Arm] = {
    "grpo": (),
    "prorag": ("process_reward=prm",),
    "prorag-oracle": ("process_reward=oracle",),
    "prorag-oracle-first-error": ("process_reward=oracle-first-error",),
    "prorag-shuffled": ("process_reward=shuffled",),
    "prorag-oracle-first-error-shuffled": ("process_reward=oracle-first-error-shuffled",),
}
#: An arm -> its control: the same step rewards permuted within each group, which keeps their
#: distribution and removes their information. Against GRPO an arm can gain from the bare extra
#: term in its advantage; against its control, only from what the
#: rewards say about the steps. :func:`process_statistics` tests each arm against its control
#: when both ran.
CONTROLS: dict[str, str] = {
    "prorag": "prorag-shuffled",
    "prorag-oracle-first-error": "prorag-oracle-first-error-shuffled",
}
#: The arms of the family comparison (METHOD.md sections 2-5): each method's own rewards and
#: advantage, everything else (start policy, questions, budget, seeds) the same.
FAMILY_ARMS: dict[str, Arm] = {
    "grpo": (),
    "prorag": ("process_reward=prm",),
    "prorag-oracle": ("process_reward=oracle",),
    "hiprag": ("outcome_reward.form=hiprag",),
    "cpsearch": ("process_reward=cpsearch", "advantage=cpgrpo", "outcome_reward.form=f1_if_valid"),
    "p2s": ("outcome_reward.form=p2s",),
}


def arm_config(run: Run, arm: Arm, seed: int) -> Any:
    """The RL config of one arm and seed: the pipeline's (:func:`rl_config` from pi_rft) with the
    arm's assignments. An arm with a step-reward source starts from the ProRAG system's config
    (the config's beta, the PRM), one without from the GRPO system's, so the ``grpo`` and
    ``prorag`` arms have exactly those systems' fingerprints and reuse their runs."""
    source = next((a.split("=", 1)[1] for a in arm if a.startswith("process_reward=")), "none")
    cfg = rl_config(run, "rft", process=source != "none", beta=run.config.rl.beta, seed=seed)
    cfg = apply_overrides(cfg, arm, where=f"arm {' '.join(arm) or '(grpo)'}")
    # An arm that turns the dev curve on (e.g. for select_policy=best_dev) reads the dev split too.
    return replace(cfg, eval_file=rl_dev_file(run, cfg), sft_replay=rl_replay(run, cfg))


#: The family's arms trained without RL: name -> ``fn(run, seed)`` -> policy folder.
FAMILY_OFFLINE: dict[str, Callable[[Run, int], str]] = {"dpo": dpo_policy}


#: RL fields an arm may not set: what the comparison holds the same in every arm (the start
#: policy, the questions, the index, the seed that fixes the rollout streams).
HELD_FIXED: tuple[str, ...] = ("policy", "train_file", "index", "seed")


@dataclass(frozen=True)
class ArmSet:
    """The arms of one ablation: RL arms (name -> assignments), offline arms (name -> ``fn(run,
    seed)`` -> policy folder), the pairs tested beside GRPO (arm -> its control) and the primary
    contrasts (``"ARM - OTHER"``, :mod:`~prorag.experiments.ablations.contrasts`)."""

    rl: dict[str, Arm]
    offline: dict[str, Callable[[Run, int], str]]
    controls: dict[str, str]
    primary: tuple[str, ...] = ()


def ablation_arms(config: PipelineConfig, what: str) -> ArmSet:
    """The arms of ``what`` (``process`` or ``family``): the registry's (:data:`PROCESS_ARMS`, or
    :data:`FAMILY_ARMS` and :data:`FAMILY_OFFLINE`), then the config's ``extra_arms`` in their
    order, with :data:`CONTROLS` and the config's ``arm_controls``, and the config's
    ``primary_contrasts`` (None: :func:`~prorag.experiments.ablations.contrasts.default_primary`, each
    arm against :data:`REFERENCE` but the controls).

    Everything is checked here, before an ablation runs for hours: an extra arm may not reuse a
    built-in name (its runs would be taken for the built-in arm's), its assignments must set
    ``rl.*`` fields to values the RL config accepts, a control pair must name two arms, and a
    primary contrast must be one the ablation tests."""
    if what not in ("process", "family"):
        raise ValueError(f"arms belong to --what process or family, not {what!r}")
    rl: dict[str, Arm] = dict(PROCESS_ARMS if what == "process" else FAMILY_ARMS)
    offline = {} if what == "process" else dict(FAMILY_OFFLINE)
    for name, assignments in config.extra_arms.items():
        if name == FROZEN_ARM:
            raise ValueError(
                f"extra_arms.{name}: the name is the stream control's (`stream_control: true` runs it); give yours another name"
            )
        if name in rl or name in offline:
            raise ValueError(
                f"extra_arms.{name}: the {what} ablation already has an arm {name!r} "
                f"({' '.join(rl.get(name, ('offline',))) or 'outcome-only GRPO'}); give yours another name"
            )
        if not name or any(c in name for c in "/ ,"):
            raise ValueError(
                f"extra_arms: arm name {name!r} must be non-empty, without '/', ',' or spaces (it names run folders)"
            )
        arm = tuple(assignments)
        fixed = [a for a in arm if parse_assignment(a)[0].split(".")[0] in HELD_FIXED]
        if fixed:
            raise ValueError(
                f"extra_arms.{name}: {', '.join(fixed)}: every arm starts from the same pi_rft with the same RL "
                f"questions, index and seeds, so {', '.join(HELD_FIXED)} cannot be set per arm"
            )
        apply_overrides(config.rl, arm, where=f"extra_arms.{name}:")
        rl[name] = arm
    controls = dict(CONTROLS)
    known = [*rl, *offline]
    for arm, control in config.arm_controls.items():
        unknown = [a for a in (arm, control) if a not in known]
        if unknown or arm == control:
            why = f"unknown arm(s) {', '.join(unknown)}" if unknown else "an arm cannot be its own control"
            raise ValueError(f"arm_controls.{arm}: {control}: {why}; arms of the {what} ablation: {', '.join(known)}")
        controls[arm] = control
    declared = config.primary_contrasts
    primary = (
        check_primary(declared, known, REFERENCE, controls, where="primary_contrasts")
        if declared is not None
        else default_primary(known, REFERENCE, controls)
    )
    return ArmSet(rl, offline, controls, tuple(primary))


def select_arms(
    arms: Mapping[str, Arm],
    names: Sequence[str],
    label: str = "ablation",
    offline: Mapping[str, Callable[[Run, int], str]] | None = None,
) -> tuple[dict[str, Arm], dict[str, Callable[[Run, int], str]]]:
    """The RL and offline arms named in ``names``, in the registry's order (so a table's rows
    keep their usual order however the names were typed). A subset lets one run the arms a
    question needs, or spread them over machines; the reference arm (``grpo``) is the one
    every other arm is tested against, so leaving it out leaves the tables without tests."""
    offline = dict(offline or {})
    unknown = [n for n in names if n not in arms and n not in offline]
    if unknown or not names:
        known = ", ".join([*arms, *offline])
        raise ValueError(
            f"--arms of the {label}: unknown arm(s) {', '.join(unknown) or '(none given)'}; expected some of {known}"
        )
    return {a: v for a, v in arms.items() if a in names}, {a: v for a, v in offline.items() if a in names}
