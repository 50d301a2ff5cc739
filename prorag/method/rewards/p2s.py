"""P2S's path-faithfulness reward, the pure part (docs/METHOD.md §4; seeds/p2s.txt Eq. 6-9).

A trajectory's reasoning path ``z`` (its completion before the final ``<answer>`` tag) is cut into
steps ``z_1 .. z_m``: at the starts of its actions (``steps: tags``, the project's natural unit)
or into ``min(max_steps, |z|)`` chunks of equal size (``steps: chunks``, the paper's
``MAX_STEP_NUM`` split). Step ``i < m`` earns its prefix's best log-likelihood gain on a suffix of
the gold path ``o*`` over a masked prefix of the same length (Eq. 6); the last step earns
``log pi(y* | q, z)`` (Eq. 7). The sample reward is their weighted mean with increasing weights
``w_i = sigmoid(i)`` (Eq. 8) and the reward of the group is hierarchical (Eq. 9): a malformed
trajectory gets -1; when any trajectory of the group is right, every well-formed one gets its
outcome (1 right, 0 wrong); otherwise the path-faithfulness reward. For the first ``warmup_steps``
generation batches only the format is rewarded (the paper's cold start).

The likelihood passes and the gold-path synthesis need the policy: :mod:`prorag.supervision.p2s`
registers them as the outcome form ``"p2s"`` (with ``advantage: grpo``, ``process_reward: none``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.sampling import SampleStreams, check_sample_streams
from prorag.core.config import setting

StepUnit = Literal["tags", "chunks"]
STEP_UNITS: tuple[str, ...] = ("tags", "chunks")


@dataclass
class P2SConfig:
    """P2S's settings (``outcome_reward.p2s``). The paper states no value for K, ``MAX_STEP_NUM``
    or ``S_warmup``; the defaults below say where theirs come from."""

    k: int = setting(
        4,
        help="K, gold-path candidates sampled per question given the question and its gold answer (Eq. 4); "
        "the paper gives no value: 4, half the RL group.",
    )
    steps: StepUnit = setting(
        "tags",
        help='How a path is cut into steps: `"tags"` (at each action\'s start: METHOD.md §4, the natural unit here) '
        'or `"chunks"` (`max_steps` equal-size token chunks: the paper\'s split).',
    )
    max_steps: int = setting(
        8, help="MAX_STEP_NUM, the chunks per path with `steps: chunks` (the paper caps m but gives no value)."
    )
    warmup_steps: int = setting(
        0,
        help="S_warmup: the first this many generation batches (one per optimiser step with TRL's default "
        "steps_per_generation) reward the format only (the paper's cold start, value not given; 0: off). Counted "
        "per policy object in this process: a resumed run warms up again.",
    )
    malformed_reward: float = setting(-1.0, help="Reward of a malformed trajectory (Eq. 9's -1, also during warm-up).")
    warmup_reward: float = setting(
        1.0, help="Reward of a well-formed trajectory during warm-up (format only; the paper gives no value: +1 against -1)."
    )
    hint: str = setting(
        "{question}\nThe answer is: {answer}",
        help="The synthesis prompt's question: the question with its gold answer (`{question}`, `{answer}`: the "
        "first gold alias), so the policy samples paths towards it (Eq. 4).",
    )
    synthesis: RolloutConfig = setting(
        factory=lambda: RolloutConfig(max_actions=11, batch_size=64),
        help="The rollout engine's settings for the K candidates (sampled; `seed` is a part of every candidate's "
        "stream with `sample_streams: row`, and offset by the batch count with `batch`).",
    )
    sample_streams: SampleStreams = setting(
        "row",
        help="`row`: candidate j of a question draws from its own stream, seeded by (synthesis seed, the RL seed, the "
        "trainer's step, question id, j), so a question's candidates do not depend on which other groups of the batch "
        "need a path reward, on the batch size or on the process count; `batch`: one generator per call, seeded by "
        "synthesis seed + the batch count (whatever the RL seed), as runs made before this setting.",
    )
    batch_size: int = setting(64, help="Sequences per padded forward pass of the likelihood passes.")

    def __post_init__(self) -> None:
        if self.steps not in STEP_UNITS:
            raise ValueError(f"P2SConfig.steps must be one of {STEP_UNITS}, got {self.steps!r}")
        for name in ("k", "max_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"P2SConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"P2SConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        check_sample_streams(self.sample_streams, "P2SConfig")


def step_weights(m: int) -> list[float]:
    """``w_i = sigmoid(i)`` for ``i = 1 .. m`` (Eq. 8: a standard sigmoid of the step's index, so
    later steps weigh more and early exploration is forgiven).

    >>> [round(w, 4) for w in step_weights(3)]
    [0.7311, 0.8808, 0.9526]
    """
    return [1.0 / (1.0 + math.exp(-i)) for i in range(1, m + 1)]


def path_faithfulness(rewards: Sequence[float | None]) -> float:
    """``R_PFR-w`` (Eq. 8): the ``sigmoid(i)``-weighted mean of the step rewards, over the steps
    that have one (``None``: no gold path to compare the step with; the weights keep each step's
    index). Raises ``ValueError`` when no step has a reward.

    >>> round(path_faithfulness([-2.0, None, -1.0]), 4)
    -1.4342
    """
    pairs = [(w, r) for w, r in zip(step_weights(len(rewards)), rewards, strict=True) if r is not None]
    if not pairs:
        raise ValueError("path_faithfulness needs at least one step reward")
    return sum(w * r for w, r in pairs) / sum(w for w, _ in pairs)


def chunk_ends(length: int, max_steps: int) -> list[int]:
    """End offsets of ``min(max_steps, length)`` equal-size chunks of ``length`` tokens (the first
    ones one token longer when it does not divide).

    >>> chunk_ends(10, 3), chunk_ends(2, 8), chunk_ends(0, 8)
    ([4, 7, 10], [1, 2], [])
    """
    m = min(max_steps, length)
    size, longer = divmod(length, m) if m else (0, 0)
    return [i * size + min(i, longer) for i in range(1, m + 1)]


def tag_ends(starts: Sequence[int], length: int) -> list[int]:
    """End offsets of the steps of a ``length``-token path whose actions start at ``starts``:
    each step runs to the next action's start, the last to ``length`` (tokens before the first
    action belong to the first step).

    >>> tag_ends([0, 5, 9, 12], 12), tag_ends([], 4)
    ([5, 9, 12], [4])
    """
    inner = sorted({int(s) for s in starts if 0 < int(s) < length})
    return [*inner, length] if length > 0 else []


def step_ends(unit: StepUnit, starts: Sequence[int], length: int, max_steps: int) -> list[int]:
    """The step cut of :class:`P2SConfig`'s ``steps``: :func:`tag_ends` or :func:`chunk_ends`."""
    return tag_ends(starts, length) if unit == "tags" else chunk_ends(length, max_steps)


def best_gain(with_prefix: Sequence[float], masked: Sequence[float]) -> float:
    """Eq. 6 for one prefix: ``max_t [log pi(s_t | q, p_i) - log pi(s_t | q, p_masked)]`` from the
    two log-likelihoods of each gold suffix ``s_t``.

    >>> best_gain([-3.0, -1.0], [-4.0, -0.5])
    1.0
    """
    if len(with_prefix) != len(masked) or not with_prefix:
        raise ValueError(f"best_gain needs as many masked as prefixed suffix scores (>= 1), got {len(with_prefix)}/{len(masked)}")
    return max(a - b for a, b in zip(with_prefix, masked, strict=True))


def group_solved(correct: Sequence[bool], group_ids: Sequence[Hashable]) -> list[bool]:
    """``S_G`` of each trajectory's group: whether any trajectory of its group is right."""
    solved = {g for g, c in zip(group_ids, correct, strict=True) if c}
    return [g in solved for g in group_ids]


def needs_path_reward(format_ok: Sequence[bool], correct: Sequence[bool], group_ids: Sequence[Hashable]) -> list[bool]:
    """Which trajectories Eq. 9 gives the path reward: well formed, in a group nobody solved."""
    return [f and not s for f, s in zip(format_ok, group_solved(correct, group_ids), strict=True)]


def hierarchical_rewards(
    format_ok: Sequence[bool],
    correct: Sequence[bool],
    path: Sequence[float | None],
    group_ids: Sequence[Hashable],
    malformed_reward: float = -1.0,
) -> list[float]:
    """Eq. 9: ``malformed_reward`` without the format; the binary outcome (1 right, 0 wrong) when
    the group has a right answer; else the path reward ``path[i]`` (required there).

    >>> hierarchical_rewards([True, False, True, True], [True, False, False, False], [None, None, None, -2.5], [0, 0, 0, 1])
    [1.0, -1.0, 0.0, -2.5]
    """
    out = []
    for f, c, s, p in zip(format_ok, correct, group_solved(correct, group_ids), path, strict=True):
        if not f:
            out.append(float(malformed_reward))
        elif s:
            out.append(float(c))
        elif p is None:
            raise ValueError("a well-formed trajectory of an unsolved group needs its path reward")
        else:
            out.append(float(p))
    return out


def warmup_rewards(format_ok: Sequence[bool], config: P2SConfig) -> list[float]:
    """The cold start's format-only reward: ``warmup_reward`` if well formed, else ``malformed_reward``."""
    return [config.warmup_reward if f else config.malformed_reward for f in format_ok]


__all__ = [
    "STEP_UNITS",
    "P2SConfig",
    "StepUnit",
    "best_gain",
    "chunk_ends",
    "group_solved",
    "hierarchical_rewards",
    "needs_path_reward",
    "path_faithfulness",
    "step_ends",
    "step_weights",
    "tag_ends",
    "warmup_rewards",
]
