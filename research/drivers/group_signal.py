"""Which RL questions can outcome-only GRPO learn from, and in which direction: each question's
greedy answer beside G sampled trajectories from the same policy.

    python -m research.drivers.group_signal RUN [--policy DIR] [--split rl] [--questions 96] [--group-size 8]
        [--temperature 1.0] [--json OUT.json]

A group whose G answers all agree on EM has outcome advantage 0 on every row: nothing to learn
(the trainer logs that share as ``groups_em_agree``). The rest are split by the greedy answer:

* **greedy right, mixed**: the gradient pushes the samples toward what greedy already does
  (sharpening); greedy EM cannot rise from these;
* **greedy wrong, mixed**: some sample is right where greedy is wrong; the only groups whose
  outcome signal can raise greedy (evaluation) EM;
* **all wrong**: no outcome signal at all; a process reward is the only signal there.

Also prints sampled EM (the training batches' EM) beside greedy EM.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.core.metrics import exact_match
from prorag.data.jsonl import write_json
from prorag.data.records import read_records
from prorag.models.checkpoints import load_policy
from prorag.retrieval.index import open_retriever


def group_kind(greedy_right: bool, right: int, size: int) -> str:
    """The class of one question's group: ``all right``, ``all wrong``, or ``mixed``, after the greedy answer."""
    outcome = "all wrong" if right == 0 else "all right" if right == size else "mixed"
    return f"greedy {'right' if greedy_right else 'wrong'}, {outcome}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a pipeline run folder (splits/, index/, policies/)")
    parser.add_argument("--policy", type=Path, help="default: RUN/policies/rft/policy (RL's initial policy)")
    parser.add_argument("--split", default="rl", help="records file under RUN/splits/ (default rl)")
    parser.add_argument("--questions", type=int, default=96, help="the first N questions (default 96, the arms' RL pass)")
    parser.add_argument("--group-size", type=int, default=8, help="G, samples per question (default 8)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0, RL's)")
    parser.add_argument("--max-actions", type=int, default=11, help="action cap (default 11, RL's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model, tokenizer = load_policy(str(args.policy or args.run / "policies" / "rft" / "policy"))
    retriever = open_retriever(args.run / "index")
    records = read_records(args.run / "splits" / f"{args.split}.jsonl")[: args.questions]
    config = RolloutConfig(max_actions=args.max_actions, batch_size=64, temperature=args.temperature)
    greedy = RolloutEngine(model, tokenizer, retriever, replace(config, greedy=True)).rollout(records, seed=args.seed)
    g = args.group_size
    samples = RolloutEngine(model, tokenizer, retriever, config).rollout([r for r in records for _ in range(g)], seed=args.seed)

    kinds: Counter[str] = Counter()
    sampled_right = greedy_right = 0
    for i, record in enumerate(records):
        right = sum(int(exact_match(t.answer or "", record.golden_answers)) for t in samples[i * g : (i + 1) * g])
        greedy_ok = bool(exact_match(greedy[i].answer or "", record.golden_answers))
        sampled_right += right
        greedy_right += greedy_ok
        kinds[group_kind(greedy_ok, right, g)] += 1
    n = len(records)
    greedy_em = greedy_right / n
    print(f"{n} questions of {args.run / 'splits' / args.split}.jsonl, G {g}, temperature {args.temperature}")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind:28s} {count:4d}  {100 * count / n:5.1f}%")
    print(f"greedy EM {100 * greedy_em:.1f}, sampled EM {100 * sampled_right / (n * g):.1f}")
    if args.json:
        write_json(
            args.json,
            {"run": str(args.run), "questions": n, "group_size": g, "temperature": args.temperature, "groups": dict(kinds)},
        )
        print(f"-> {args.json}")


if __name__ == "__main__":
    main()
