"""How long ``prorag COMMAND --help`` takes, per command, against the interpreter's own start-up.

Each command's help in a fresh process (what a user waits for), the best of ``--repeats`` and the
range of the runs; the baseline is ``python -c pass`` in the same run on the same machine. The
help must not import the training stack (tests/cli/test_presentation.py checks the imports; this
prints the time).

    python benchmarks/cli_help.py [--repeats 3] [--json results/FILE.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_name  # benchmarks/machine.py, beside this file

COMMANDS = [
    "",
    "demo",
    "world",
    "index",
    "retrieve",
    "sft-data",
    "sft",
    "eval",
    "mcts",
    "pairs",
    "prm",
    "rft",
    "rl",
    "dpo",
    "pipeline",
    "ablate",
    "table1",
    "report",
]


def times(args: list[str], repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` runs of ``args``, each in a fresh process."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="Also write every time measured here.")
    args = parser.parse_args()
    machine = machine_name()
    print(f"machine: {machine}")
    base = times([sys.executable, "-c", "pass"], args.repeats)
    print(f"python start-up: {min(base):.2f} s")
    rows = {}
    for command in COMMANDS:
        seconds = times([sys.executable, "-m", "prorag.cli", *([command] if command else []), "--help"], args.repeats)
        rows[command or "(root)"] = seconds
        best = min(seconds)
        print(
            f"prorag {command or '':<10} --help  {best:5.2f} s  (runs {best:.2f}-{max(seconds):.2f} s; "
            f"{best / min(base):4.1f}x start-up)"
        )
    print(f"slowest: {max(min(t) for t in rows.values()):.2f} s (best of {args.repeats} each)")
    if args.json is not None:
        record = {"machine": machine, "repeats": args.repeats, "python_startup_s": base, "help_s": rows}
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
