"""The arms of an arms file (``research/arms/*.yaml``), for the shell drivers and for readers.

    python -m research.drivers.arms flags ARM [--file FILE]   # `prorag rl` options, one word a line
    python -m research.drivers.arms list [--file FILE]        # old code -> name -> what, as markdown

Run from the repository root. ``flags`` exits 2 when ARM is not an arm's name, naming the arm an old code now names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from research.analysis.arms import RL_SEED_RUNS, code_table, read_arms, rl_flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("flags", "list"))
    parser.add_argument("arm", nargs="?", help="the arm's name (flags)")
    parser.add_argument("--file", type=Path, default=RL_SEED_RUNS, help="the arms file (default: %(default)s)")
    args = parser.parse_args(argv)
    arms = read_arms(args.file)
    if args.what == "list":
        print(code_table(arms))
        return 0
    if args.arm not in arms:
        renamed = [a.name for a in arms.values() if a.code == args.arm]
        hint = f"{args.arm!r} is the old code of arm {renamed[0]!r}" if renamed else f"arms: {', '.join(arms)}"
        print(f"{args.file}: unknown arm {args.arm!r}; {hint}", file=sys.stderr)
        return 2
    print("\n".join(rl_flags(arms[args.arm])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
