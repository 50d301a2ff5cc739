"""Arms as YAML: an arm is a named list of ``rl.*`` assignments (``--set`` syntax).

An arms file holds ``schedule``, the assignments every arm starts from, and ``arms``: per name,
``set`` (its own assignments, applied after the schedule, so a later one wins), ``what`` (one
line) and ``code``, the short code the arm had in the results files and docs/LOG.md entries
written before it had a name. Codes are for reading those files: no driver runs an arm by its
code. Every assignment keeps the ``rl.`` prefix of the pipeline's sections, so an arm reads as
``prorag pipeline --set`` takes it; :func:`rl_flags` drops the prefix for ``prorag rl``. The
values are not checked here (that needs the RL config class); the tests apply every arm to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The arms of ``research/drivers/rl_seed_runs.sh``.
RL_SEED_RUNS = Path(__file__).resolve().parents[1] / "arms" / "rl_seed_runs.yaml"
PREFIX = "rl."


@dataclass(frozen=True)
class Arm:
    """One arm: its name, what it is, the file's schedule and its own assignments, and the code it had
    before (None for an arm that never had one)."""

    name: str
    what: str
    schedule: tuple[str, ...]
    own: tuple[str, ...]
    code: str | None = None

    @property
    def assignments(self) -> tuple[str, ...]:
        """The schedule's assignments, then the arm's own (so the arm's win)."""
        return self.schedule + self.own


def _assignments(value: Any, where: str) -> tuple[str, ...]:
    """A YAML list of ``rl.key=value`` strings, refused with ``where`` named if it is anything else."""
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"{where}: expected a list of rl.KEY=VALUE strings, got {value!r}")
    bad = [a for a in value if not a.startswith(PREFIX) or "=" not in a or not a.partition("=")[0][len(PREFIX) :]]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r} is not an rl.KEY=VALUE assignment")
    return tuple(value)


def parse_arms(data: Any, where: str = "arms file") -> dict[str, Arm]:
    """The arms of an arms file's parsed YAML, in file order; unknown keys, a duplicate code and an
    arm without assignments are refused (an arm with none would silently be its schedule)."""
    if not isinstance(data, dict) or set(data) - {"schedule", "arms"} or not isinstance(data.get("arms"), dict):
        raise ValueError(f"{where}: expected a mapping with 'arms' (name -> arm) and an optional 'schedule'")
    schedule = _assignments(data.get("schedule", []), f"{where}: schedule")
    arms: dict[str, Arm] = {}
    codes: dict[str, str] = {}
    for name, body in data["arms"].items():
        here = f"{where}: arm {name!r}"
        if not isinstance(body, dict) or set(body) - {"set", "what", "code"} or "set" not in body:
            raise ValueError(f"{here}: expected a mapping with 'set' and optional 'what', 'code'")
        own = _assignments(body["set"], here)
        if not own:
            raise ValueError(f"{here}: no assignments")
        code = body.get("code")
        if code is not None:
            if code in codes:
                raise ValueError(f"{here}: code {code!r} is already arm {codes[code]!r}'s")
            codes[code] = name
        arms[name] = Arm(name=name, what=str(body.get("what", "")), schedule=schedule, own=own, code=code)
    return arms


def read_arms(path: Path = RL_SEED_RUNS) -> dict[str, Arm]:
    """The arms of the YAML file ``path`` (:func:`parse_arms`)."""
    return parse_arms(yaml.safe_load(Path(path).read_text()), str(path))


def rl_flags(arm: Arm) -> list[str]:
    """The arm as ``prorag rl`` options: ``--set KEY=VALUE`` per assignment, the ``rl.`` prefix dropped."""
    return [word for a in arm.assignments for word in ("--set", a[len(PREFIX) :])]


def code_table(arms: dict[str, Arm]) -> str:
    """A markdown table of the arms that had a code: old code, name, what the arm is."""
    rows = ["| old code | arm | what it is |", "|---|---|---|"]
    rows += [f"| `{a.code}` | `{a.name}` | {a.what} |" for a in arms.values() if a.code is not None]
    return "\n".join(rows)
