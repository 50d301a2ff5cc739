"""Range checks of the settings several configs declare alike: temperature, top-p, learning rate.

Each config calls them from its ``__post_init__``, so a YAML file, ``--set`` and Python are refused
alike, before any model loads or run folder is written, with one line naming the field and what was
expected. NaN fails every check (no comparison holds for it), and infinities are refused too.

A temperature of 0 means greedy decoding (argmax) wherever one is read: the rollout engine, a local
HF generator, a served model. A stage whose method needs samples that differ (RL's groups, MCTS's
expansions) refuses 0 with its reason. A learning rate of 0 is refused unless the config says what
it means there (RL's ``frozen`` control: the optimiser runs and changes nothing).
"""

from __future__ import annotations

import math


def check_temperature(value: float, field: str, *, needs_sampling: str | None = None) -> None:
    """Refuse a sampling temperature below 0 or not finite; ``field`` names it in the error
    (``RolloutConfig.temperature``). With ``needs_sampling`` (why the stage must sample), 0 too."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{field} must be a finite number >= 0 (0: greedy decoding), got {value}")
    if needs_sampling and value == 0:
        raise ValueError(f"{field} must be > 0 ({needs_sampling}), got {value}")


def check_top_p(value: float, field: str) -> None:
    """Refuse a nucleus mass outside ``(0, 1]`` (1: no cut); ``field`` names it in the error."""
    if not 0 < value <= 1:
        raise ValueError(f"{field} must be in (0, 1] (1.0: no nucleus cut), got {value}")


def check_learning_rate(value: float, field: str, *, zero_means: str | None = None) -> None:
    """Refuse a learning rate that is not a finite number > 0; ``field`` names it in the error.

    Checked here rather than left to torch, which refuses a negative or NaN rate only once the
    model has loaded and the run folder has been written, and without naming the field. With
    ``zero_means`` (what a rate of 0 does in this stage), 0 is accepted."""
    if not (math.isfinite(value) and (value > 0 or (value == 0 and zero_means))):
        expected = f"a finite number >= 0 (0: {zero_means})" if zero_means else "a finite number > 0"
        raise ValueError(f"{field} must be {expected}, got {value}")


__all__ = ["check_learning_rate", "check_temperature", "check_top_p"]
