"""How long ``prorag COMMAND --help`` takes, per command, against the interpreter's own start-up.

Each command's help in a fresh process (what a user waits for), the best of ``--repeats``; the
baseline is ``python -c pass`` in the same run on the same machine. The help must not import the
training stack (tests/cli/test_presentation.py checks the imports; this prints the time).

    python benchmarks/cli_help.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

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


def best_time(args: list[str], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``args`` (seconds)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine_name()}")
    base = best_time([sys.executable, "-c", "pass"], args.repeats)
    print(f"python start-up: {base:.2f} s")
    worst = 0.0
    for command in COMMANDS:
        seconds = best_time([sys.executable, "-m", "prorag.cli", *([command] if command else []), "--help"], args.repeats)
        worst = max(worst, seconds)
        print(f"prorag {command or '':<10} --help  {seconds:5.2f} s  ({seconds / base:4.1f}x start-up)")
    print(f"slowest: {worst:.2f} s")


if __name__ == "__main__":
    main()
