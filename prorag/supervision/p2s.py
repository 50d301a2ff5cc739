"""P2S's gold-path synthesis and likelihood passes, and its outcome reward ``"p2s"`` (docs/METHOD.md §4).

The pure part (step cut, weights, Eq. 9) is :mod:`prorag.method.rewards.p2s`; this module runs
the policy for the groups that need the path reward (well formed, nobody in the group right):
it synthesizes a gold path ``o*`` per question from the policy prompted with the gold answer
(:func:`synthesize`), then scores each trajectory's steps against it in batched likelihood passes
(:meth:`P2SReward.path_rewards`).

A suffix's likelihood counts the tokens the policy writes (``env_mask``), not retrieved text. The
candidates search the trainer's retriever, as the rollouts do (a :class:`P2SReward` built with a
retriever uses its own; with neither, searches return no documents). Without a well-formed
candidate a group has no ``o*``: its trajectories get Eq. 7's last-step reward alone. "Right" is
exact match of the answer of a well-formed trajectory; the outcome Eq. 9 keeps for a solved group
is that 1/0.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prorag.agent.sampling import stream_seed
from prorag.agent.schema import ANSWER_CLOSE, ANSWER_OPEN
from prorag.agent.trajectory import Trajectory
from prorag.core.lazy_modules import lazy_module
from prorag.core.metrics import exact_match
from prorag.data.records import Record
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
    OutcomeRewardConfig,
    RewardInputs,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.method.rewards.p2s import (
    P2SConfig,
    best_gain,
    hierarchical_rewards,
    needs_path_reward,
    path_faithfulness,
    step_ends,
    warmup_rewards,
)
from prorag.retrieval.base import Retriever
from prorag.supervision.hiprag import NoDocuments
from prorag.supervision.reward_model import token_logprobs

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")


#: One likelihood pass: context ids, target ids, and a 0/1 weight per target token (which count).
Pass = tuple[list[int], list[int], list[int]]

#: Generation batches each policy has been scored on (the warm-up's step count), per policy object.
_BATCHES_SEEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def sequence_logprobs(model: Any, passes: Sequence[Pass], pad_id: int, batch_size: int = 64) -> list[float]:
    """``sum_j weight_j * log p(target_j | context, target_<j)`` of each pass under the causal LM
    ``model``, in right-padded batches of ``batch_size`` rows sorted by length (little padding);
    identical passes are computed once."""
    with torch.no_grad():
        keys = [(tuple(c), tuple(t), tuple(w)) for c, t, w in passes]
        distinct = list(dict.fromkeys(keys))
        order = sorted(range(len(distinct)), key=lambda i: len(distinct[i][0]) + len(distinct[i][1]))
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        scores: dict[tuple, float] = {}
        try:
            for start in range(0, len(order), batch_size):
                rows = [distinct[i] for i in order[start : start + batch_size]]
                width = max(len(c) + len(t) for c, t, _ in rows)
                ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
                mask = torch.zeros(len(rows), width, dtype=torch.long)
                weight = torch.zeros(len(rows), width)
                for r, (c, t, w) in enumerate(rows):
                    n = len(c) + len(t)
                    ids[r, :n] = torch.tensor(c + t)
                    mask[r, :n] = 1
                    weight[r, len(c) : n] = torch.tensor(w, dtype=weight.dtype)
                logp = token_logprobs(model, ids.to(device), mask.to(device)).cpu()
                for row, total in zip(rows, (logp * weight).sum(-1).tolist(), strict=True):
                    scores[row] = float(total)
        finally:
            model.train(was_training)
        return [scores[k] for k in keys]


def answer_target(tokenizer: Any, answer: str) -> list[int]:
    """The ids of ``<answer> y* </answer>``, laid out as the trajectories write it."""
    return tokenizer(f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}", add_special_tokens=False)["input_ids"]


def reasoning_path(traj: Trajectory, answer_open_id: int) -> int:
    """Length of the reasoning path ``z`` of ``traj``: its completion before the last ``<answer>``
    tag (the whole completion without one)."""
    ids = traj.completion_ids
    last = max((i for i, t in enumerate(ids) if t == answer_open_id), default=len(ids))
    return last


def trajectory_step_ends(traj: Trajectory, length: int, config: P2SConfig) -> list[int]:
    """The step cut of the first ``length`` completion tokens of ``traj`` (:func:`step_ends`)."""
    return step_ends(config.steps, [a.span[0] for a in traj.actions], length, config.max_steps)


def hint_seed(config: P2SConfig, seed: int, step: int, question_id: str, candidate: int) -> int:
    """The stream of candidate ``candidate`` of question ``question_id`` at trainer step ``step`` of
    the RL run seeded ``seed`` (``sample_streams: row``): named by the question, not by its place
    in the batch, so it draws alike whichever other groups need a path reward."""
    return stream_seed("prorag-p2s", int(config.synthesis.seed), int(seed), int(step), question_id, int(candidate))


def synthesize(
    policy: Any,
    tokenizer: Any,
    records: Sequence[Record],
    config: P2SConfig,
    retriever: Retriever | None = None,
    seed: int = 0,
    step: int = 0,
) -> list[list[Trajectory]]:
    """K candidate gold paths per record (Eq. 4): the policy prompted with ``config.hint`` (the
    question and its first gold alias), sampled, every candidate of the batch in one engine call;
    a record's metadata (its retrieval partition) is kept. ``seed`` (the RL run's) and ``step``
    (the batch's) name each candidate's stream (:func:`hint_seed`); with ``sample_streams:
    batch`` one generator seeded ``config.synthesis.seed + step`` samples them all."""
    hinted = [
        Record(r.id, config.hint.format(question=r.question, answer=r.golden_answers[0]), list(r.golden_answers), r.metadata)
        for r in records
        for _ in range(config.k)
    ]
    from prorag.agent.rollout import RolloutEngine  # the engine imports torch: not at import (--help)

    engine = RolloutEngine(policy, tokenizer, retriever or NoDocuments(), replace(config.synthesis, greedy=False))
    rows = (
        [hint_seed(config, seed, step, r.id, j) for r in records for j in range(config.k)]
        if config.sample_streams == "row"
        else None
    )
    trajs = engine.rollout(hinted, seed=config.synthesis.seed + step, row_seeds=rows)
    return [trajs[i * config.k : (i + 1) * config.k] for i in range(len(records))]


@OUTCOME_REWARDS.register(  # the class is the factory: P2SReward(config)
    "p2s",
    config=P2SConfig,
    help="P2S's hierarchical reward: outcome, then path faithfulness to a gold-conditioned path the policy writes",
)
class P2SReward:
    """P2S's reward (Eq. 9, :func:`~prorag.method.rewards.p2s.hierarchical_rewards`) as an
    :class:`~prorag.method.rewards.outcome.OutcomeReward`. Without a policy (TRL's logged reward) no likelihood is computed: the path
    reward is then 0 and no warm-up batch is counted."""

    def __init__(self, config: OutcomeRewardConfig, retriever: Retriever | None = None) -> None:
        self.config = config
        self.p2s: P2SConfig = config.p2s
        self.retriever = retriever
        self.gold_paths: dict[str, Trajectory] = {}
        """The last call's ``o*`` of each question that had a well-formed candidate (by question id)."""

    def __call__(self, batch: RewardInputs) -> list[float]:
        trajectories, golds, tokenizer, policy = batch.trajectories, batch.golds, batch.tokenizer, batch.policy
        fmt = [trajectory_format_valid(t, tokenizer, strict=self.config.strict) for t in trajectories]
        answers = [trajectory_answer(t, tokenizer) for t in trajectories]
        correct = [f and a is not None and bool(exact_match(a, list(g))) for f, a, g in zip(fmt, answers, golds, strict=True)]
        groups = [t.id for t in trajectories]
        seen = 0
        if policy is not None:
            seen = _BATCHES_SEEN.get(policy, 0)
            _BATCHES_SEEN[policy] = seen + 1
            if seen < self.p2s.warmup_steps:
                return warmup_rewards(fmt, self.p2s)
        need = needs_path_reward(fmt, correct, groups)
        path: list[float | None] = [None] * len(trajectories)
        if any(need):
            todo = [i for i, n in enumerate(need) if n]
            if policy is None:
                values = [0.0] * len(todo)
            else:
                rows = [trajectories[i] for i in todo]
                # Row streams are named by the trainer's step (a resumed run draws as before);
                # batch streams keep the count of calls they were seeded with before.
                row = self.p2s.sample_streams == "row" and batch.step is not None
                step = batch.step if row else seen
                values = self.path_rewards(
                    policy, tokenizer, rows, [golds[i] for i in todo], step, batch.retriever or self.retriever, batch.seed
                )
            for i, v in zip(todo, values, strict=True):
                path[i] = v
        return hierarchical_rewards(fmt, correct, path, groups, self.p2s.malformed_reward)

    def path_rewards(
        self,
        policy: Any,
        tokenizer: Any,
        trajectories: Sequence[Trajectory],
        golds: Sequence[Sequence[str]],
        step: int = 0,
        retriever: Retriever | None = None,
        seed: int = 0,
    ) -> list[float]:
        """``R_PFR-w`` (Eq. 8) of each trajectory against its group's synthesized ``o*`` (the
        candidates search ``retriever``, else this reward's own; their streams are named by the RL
        run's ``seed`` and the batch's ``step``: :func:`synthesize`). Three stages, each batched:

        1. **Synthesis** (Eq. 4-5): K candidates per question, each from its own stream (the RL
           seed, the step, the question, the candidate); the malformed ones are dropped and ``o*``
           is the one with the highest ``S_k = log pi(y* | q, z_k)`` (the plain prompt, the
           candidate's path, then ``<answer> y* </answer>``).
        2. **Answer passes**: ``S_k`` of every candidate and Eq. 7's ``log pi(y* | q, z)`` of every
           trajectory's last step, in one padded pass (:func:`sequence_logprobs`).
        3. **Suffix passes** (Eq. 6): for every prefix ``p_i`` (``i < m``) and every suffix ``s_t``
           of ``o*`` (cut like the trajectories), ``log pi(s_t | q, p_i)`` and
           ``log pi(s_t | q, p_masked)``, ``p_masked`` being ``p_i`` with every token replaced by
           the pad token (same length): all of the batch's ``O(m^2)`` pairs in one padded pass,
           identical sequences computed once.
        """
        cfg = self.p2s
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        open_id = tokenizer.convert_tokens_to_ids(ANSWER_OPEN)
        firsts = list(dict.fromkeys(t.id for t in trajectories))
        prompt = {t.id: list(t.prompt_ids) for t in trajectories}
        gold = {t.id: str(g[0]) for t, g in zip(trajectories, golds, strict=True)}
        # The question with its retrieval partition (the trajectory keeps it in its metadata).
        source = {t.id: Record(t.id, t.question, [gold[t.id]], dict(t.metadata)) for t in trajectories}
        records = [source[q] for q in firsts]
        candidates = synthesize(policy, tokenizer, records, cfg, retriever or self.retriever, seed, step)
        target = {q: answer_target(tokenizer, gold[q]) for q in firsts}

        # --- answer passes: S_k of the well-formed candidates, and Eq. 7 of every trajectory
        kept = [
            (q, c)
            for q, cands in zip(firsts, candidates, strict=True)
            for c in cands
            if trajectory_format_valid(c, tokenizer, strict=self.config.strict)
        ]
        lengths = [reasoning_path(t, open_id) for t in trajectories]
        passes: list[Pass] = [
            (prompt[q] + c.completion_ids[: reasoning_path(c, open_id)], target[q], [1] * len(target[q])) for q, c in kept
        ]
        passes += [
            (prompt[t.id] + t.completion_ids[:n], target[t.id], [1] * len(target[t.id]))
            for t, n in zip(trajectories, lengths, strict=True)
        ]
        scores = sequence_logprobs(policy, passes, pad, cfg.batch_size)
        best: dict[str, tuple[float, Trajectory]] = {}
        for (q, c), s in zip(kept, scores[: len(kept)], strict=True):
            if q not in best or s > best[q][0]:
                best[q] = (s, c)
        last = scores[len(kept) :]
        self.gold_paths = {q: o for q, (_, o) in best.items()}

        # --- suffix passes: every prefix of every trajectory against every suffix of its o*
        suffixes: dict[str, list[tuple[list[int], list[int]]]] = {}
        for q, (_, o) in best.items():
            ids = list(o.completion_ids)
            while ids and ids[-1] == tokenizer.eos_token_id:
                ids.pop()
            starts = [0, *trajectory_step_ends(o, len(ids), cfg)[:-1]]
            suffixes[q] = [(ids[s:], [int(m) for m in o.env_mask[s : len(ids)]]) for s in starts]
        cuts = [trajectory_step_ends(t, n, cfg) if t.id in suffixes else [n] for t, n in zip(trajectories, lengths, strict=True)]
        gains: list[Pass] = []
        for t, ends in zip(trajectories, cuts, strict=True):
            for end in ends[:-1]:
                for s, w in suffixes[t.id]:
                    gains.append((prompt[t.id] + t.completion_ids[:end], s, w))
                    gains.append((prompt[t.id] + [pad] * end, s, w))
        flat = sequence_logprobs(policy, gains, pad, cfg.batch_size) if gains else []
        out, at = [], 0
        for t, ends, final in zip(trajectories, cuts, last, strict=True):
            n_suffix = len(suffixes.get(t.id, []))
            steps: list[float | None] = []
            for _ in ends[:-1]:
                chunk = flat[at : at + 2 * n_suffix]
                steps.append(best_gain(chunk[0::2], chunk[1::2]))
                at += 2 * n_suffix
            out.append(path_faithfulness([*steps, final]))
        return out


__all__ = [
    "P2SReward",
    "Pass",
    "answer_target",
    "hint_seed",
    "reasoning_path",
    "sequence_logprobs",
    "synthesize",
    "trajectory_step_ends",
]
