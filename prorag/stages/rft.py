"""Stage 3 of ProRAG: PRM-guided rejection-sampling fine-tuning (docs/METHOD.md §2, stage 3) -> ``pi_rft``.

``pi_sft`` answers each question ``N`` times. Outcome filter: keep trajectories whose answer is
correct (EM, or F1 above a threshold, read as the outcome reward reads it). Process filter: within
them an action is a target iff its PRM logit > 0 and it is well formed (the PRM never saw malformed
steps); ``prm_scope="reasoning"`` leaves the answer to the outcome filter.

Fine-tuning is stage 1's trainer over whole trajectories whose loss mask (:func:`rft_loss_mask`)
is 1 only on kept actions: rejected ones stay in the context, never as targets, which equals the
separate (context, action) pairs and is cheaper. Sample ``k`` of a question draws from its own
stream, seeded by ``(seed, question id, k)``, so the samples depend neither on where a run stopped
nor on how the rows were batched; sampling goes in fixed chunks and resumes chunk by chunk.
Writes ``rft_config.json``, ``samples.jsonl``, ``kept.jsonl``, ``rft_counts.json``,
``checkpoints/``, ``metrics.jsonl`` and ``policy/``.
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from tqdm.auto import tqdm

from prorag.agent.context_budget import drop_over_long
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import check_gpu_share
from prorag.agent.sampling import SampleStreams, stream_seed
from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.core.config import LATER_FIELDS, without_later_fields
from prorag.core.metrics import exact_match, f1_score
from prorag.data.jsonl import JsonlAppender, read_json, read_jsonl, write_json, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.losses import format_token_weights, tag_weight_table
from prorag.method.rewards.outcome import trajectory_answer
from prorag.method.rewards.process import PRMScope, prm_judged_actions
from prorag.retrieval.base import Retriever
from prorag.stages.rft_config import Correctness, RFTConfig
from prorag.stages.sft import make_sft_trainer
from prorag.stages.training import resume_training, save_trained_policy

if TYPE_CHECKING:
    from prorag.supervision.reward_model import StepScorer

log = logging.getLogger(__name__)

#: The least share of the GPU a standalone vLLM engine (``rollout.backend: vllm``) must leave to the
#: policy RFT fine-tunes after sampling and to the PRM scoring the samples (docs/GPU.md).
RFT_GPU_SHARE = 0.3


@dataclass
class RFTCounts:
    """How much each filter kept (written to ``rft_counts.json`` and logged)."""

    questions: int = 0
    samples: int = 0
    correct: int = 0
    """Trajectories whose answer passed the outcome filter."""
    actions_scored: int = 0
    """Actions of the correct trajectories (all scored by the PRM)."""
    actions_kept: int = 0
    """Actions that passed the PRM filter: the (context, action) training pairs."""
    trajectories_kept: int = 0
    """Correct trajectories with at least one kept action (one training example each)."""
    by_hops: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per hop count of the questions (where the records give one): ``questions``, ``samples``,
    ``correct`` and ``trajectories_kept``. The outcome filter keeps what pi_sft already answers, so
    long chains, which it rarely gets right, can all but vanish from the kept set, and fine-tuning
    on that set then teaches the policy to stop searching early; these counts show how skewed the
    set is."""

    def describe(self) -> str:
        """What the filters kept, on one line per hop count after the totals (``prorag rft`` prints it)."""
        lines = [
            f"kept {self.trajectories_kept} of {self.samples} samples ({self.correct} correct) of {self.questions} "
            f"questions; {self.actions_kept} of {self.actions_scored} scored actions"
        ]
        lines += [
            f"  {h}-hop questions: {c['questions']}, {c['correct']} of {c['samples']} samples correct, {c['trajectories_kept']} kept"
            for h, c in self.by_hops.items()
        ]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the filters


def is_correct(answer: str | None, golds: Sequence[str], correctness: Correctness = "em", f1_threshold: float = 0.8) -> bool:
    """The outcome filter: a missing answer is wrong; otherwise normalised EM with a gold alias
    (``"em"``) or token F1 of at least ``f1_threshold`` (``"f1"``)."""
    if answer is None:
        return False
    if correctness == "em":
        return exact_match(answer, list(golds)) == 1.0
    return f1_score(answer, list(golds)) >= f1_threshold


def kept_actions(
    actions: Sequence[ActionRecord],
    prm_logits: Sequence[float],
    threshold: float = 0.0,
    *,
    drop_malformed: bool = True,
    scope: PRMScope = "all",
) -> list[int]:
    """The process filter: indices of the actions whose PRM logit is strictly above
    ``threshold`` (and, with ``drop_malformed``, that are well formed). With ``scope=
    "reasoning"`` an action the PRM does not judge (a well-formed answer,
    :func:`~prorag.method.rewards.process.prm_judged_actions`) is kept whatever its logit."""
    if len(actions) != len(prm_logits):
        raise ValueError(f"{len(prm_logits)} PRM logits for {len(actions)} actions")
    judged = set(prm_judged_actions(actions, scope))
    return [
        i
        for i, (action, logit) in enumerate(zip(actions, prm_logits, strict=True))
        if (logit > threshold or i not in judged) and (action.well_formed or not drop_malformed)
    ]


def rft_loss_mask(traj: Trajectory, kept: Sequence[int]) -> list[int]:
    """The loss mask over ``prompt_ids + completion_ids``: 1 on the tokens of the kept actions'
    spans that the model wrote, 0 everywhere else (prompt, environment tokens, rejected
    actions). A span never holds an environment token; the env mask is applied anyway, so no
    retrieval token can become a target whatever the spans say."""
    offset = len(traj.prompt_ids)
    mask = [0] * (offset + len(traj.completion_ids))
    for i in kept:
        start, end = traj.actions[i].span
        for t in range(start, end):
            if traj.env_mask[t]:
                mask[offset + t] = 1
    return mask


def rft_example(
    traj: Trajectory, kept: Sequence[int], tag_weights: Mapping[int, float], example_id: str | None = None
) -> dict[str, Any]:
    """One training example in stage 1's format (``id``, ``input_ids``, ``loss_mask``,
    ``loss_weights``, ``length``): the sampled ids as they are, the kept actions as targets,
    weighted by :func:`~prorag.method.losses.format_token_weights`."""
    ids = [*traj.prompt_ids, *traj.completion_ids]
    mask = rft_loss_mask(traj, kept)
    weights = format_token_weights(torch.tensor([ids]), torch.tensor([mask]), tag_weights)[0]
    return {
        "id": example_id or traj.id,
        "input_ids": ids,
        "loss_mask": mask,
        "loss_weights": weights.tolist(),
        "length": len(ids),
    }


def build_rft_examples(
    samples: Sequence[Mapping[str, Any]],
    tag_weights: Mapping[int, float],
    *,
    max_length: int | None = None,
    overlong: Literal["drop", "truncate"] = "drop",
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Examples of the kept samples (rows of ``kept.jsonl``), with stage 1's handling of
    overlong ones (dropped, or cut on the right). Returns the examples and counts (``kept``,
    ``dropped_overlong``, ``truncated``, ``no_target``)."""
    out: list[dict[str, Any]] = []
    stats = {"kept": 0, "dropped_overlong": 0, "truncated": 0, "no_target": 0}
    for row in samples:
        ex = rft_example(Trajectory.from_dict(row["trajectory"]), row["kept_actions"], tag_weights, str(row["id"]))
        if max_length is not None and ex["length"] > max_length:
            if overlong == "drop":
                stats["dropped_overlong"] += 1
                continue
            ex = {**ex, **{k: ex[k][:max_length] for k in ("input_ids", "loss_mask", "loss_weights")}, "length": max_length}
            stats["truncated"] += 1
        if not any(ex["loss_mask"]):
            stats["no_target"] += 1
            continue
        out.append(ex)
        stats["kept"] += 1
    return out, stats


def judge_samples(
    trajectories: Sequence[Trajectory],
    records: Sequence[Record],
    scorer: StepScorer,
    tokenizer: Any,
    config: RFTConfig,
) -> list[dict[str, Any]]:
    """Both filters over a chunk of samples (``trajectories[i]`` answers ``records[i]``): one
    ``samples.jsonl`` row each. Only correct trajectories are sent to the PRM, in one call."""
    answers = [trajectory_answer(t, tokenizer) for t in trajectories]
    correct = [
        is_correct(a, r.golden_answers, config.correctness, config.f1_threshold) for a, r in zip(answers, records, strict=True)
    ]
    to_score = [t for t, ok in zip(trajectories, correct, strict=True) if ok]
    scored = scorer.score_trajectories(to_score) if to_score else []
    if len(scored) != len(to_score):
        raise ValueError(f"the PRM scored {len(scored)} trajectories, expected {len(to_score)}")
    scores = iter(scored)
    rows = []
    for traj, answer, ok in zip(trajectories, answers, correct, strict=True):
        logits = [float(x) for x in next(scores)] if ok else None
        kept = (
            kept_actions(
                traj.actions,
                logits,
                config.prm_threshold,
                drop_malformed=config.drop_malformed_actions,
                scope=config.prm_scope,
            )
            if logits is not None
            else []
        )
        rows.append(
            {
                "id": f"{traj.id}#{traj.metadata['sample']}",
                "question_id": traj.id,
                "sample": traj.metadata["sample"],
                "chunk": traj.metadata["chunk"],
                "answer": answer,
                "correct": ok,
                "prm_logits": logits,
                "kept_actions": kept,
                "trajectory": traj.to_dict(),
            }
        )
    return rows


def count_samples(rows: Sequence[Mapping[str, Any]], hops_of: Mapping[str, int] | None = None) -> RFTCounts:
    """The counts of :class:`RFTCounts` over ``samples.jsonl`` rows; ``hops_of`` (question id -> its
    number of hops) adds the counts per hop count of the questions it knows."""
    by_hops: dict[str, dict[str, Any]] = {}
    for r in rows:
        hops = (hops_of or {}).get(r["question_id"])
        if hops is None:
            continue
        group = by_hops.setdefault(str(hops), {"questions": set(), "samples": 0, "correct": 0, "trajectories_kept": 0})
        group["questions"].add(r["question_id"])
        group["samples"] += 1
        group["correct"] += bool(r["correct"])
        group["trajectories_kept"] += bool(r["kept_actions"])
    return RFTCounts(
        questions=len({r["question_id"] for r in rows}),
        samples=len(rows),
        correct=sum(bool(r["correct"]) for r in rows),
        actions_scored=sum(len(r["prm_logits"]) for r in rows if r["prm_logits"] is not None),
        actions_kept=sum(len(r["kept_actions"]) for r in rows),
        trajectories_kept=sum(bool(r["kept_actions"]) for r in rows),
        by_hops={h: {**g, "questions": len(g["questions"])} for h, g in sorted(by_hops.items(), key=lambda x: int(x[0]))},
    )


# ----------------------------------------------------------------------------- sampling


def chunk_seed(seed: int, chunk: int) -> int:
    """The rollout seed of one chunk (``sample_streams: batch``): a fixed function of the run's
    seed and the chunk index, so a chunk samples the same trajectories whether or not the run was
    interrupted."""
    return random.Random(f"rft:{seed}:{chunk}").getrandbits(62)


def sample_seed(seed: int, question_id: str, sample: int) -> int:
    """The stream of sample ``sample`` of question ``question_id`` (``sample_streams: row``):
    named by the question, not by its place, so it is drawn alike in any chunk or batch."""
    return stream_seed("prorag-rft", int(seed), question_id, int(sample))


def sample_chunk(
    engine: RolloutEngine, chunk: Sequence[Record], n: int, seed: int, index: int, streams: SampleStreams = "row"
) -> list[Trajectory]:
    """``n`` samples of each question of chunk ``index`` (question by question), from row streams
    (:func:`sample_seed`) or from one generator seeded by :func:`chunk_seed`."""
    expanded = [r for r in chunk for _ in range(n)]
    if streams == "row":
        return engine.rollout(expanded, row_seeds=[sample_seed(seed, r.id, k) for r in chunk for k in range(n)])
    return engine.rollout(expanded, seed=chunk_seed(seed, index))


def question_chunks(records: Sequence[Record], samples_per_question: int, batch_size: int) -> list[list[Record]]:
    """The questions cut into fixed chunks of ``max(1, batch_size // N)``: with each question
    repeated ``N`` times a chunk fills one rollout batch."""
    size = max(1, batch_size // samples_per_question)
    return [list(records[i : i + size]) for i in range(0, len(records), size)]


def _read_samples(path: Path) -> list[dict[str, Any]]:
    """The rows of ``samples.jsonl`` once each (a chunk redone after a crash appends rows that are
    already there; its seed makes them identical, the first copy is kept)."""
    if not path.exists():
        return []
    seen: set[str] = set()
    rows = []
    for row in read_jsonl(path, tolerate_truncated_tail=True):
        if row["id"] not in seen:
            seen.add(row["id"])
            rows.append(row)
    return rows


def collect_rft_samples(
    config: RFTConfig,
    run_dir: str | Path,
    engine: RolloutEngine,
    records: Sequence[Record],
    scorer: StepScorer,
    *,
    progress: bool = True,
) -> RFTCounts:
    """Sample, judge and record (the first half of the stage): append ``samples.jsonl`` chunk by
    chunk, skipping chunks already complete there, then write ``kept.jsonl`` and
    ``rft_counts.json`` from it. ``engine`` samples (its config's seed is replaced per chunk)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    n = config.samples_per_question
    records = list(records)[: config.limit] if config.limit is not None else list(records)
    records = drop_over_long(records, engine.model, engine.tokenizer, engine.config, "RFT sampling")
    path = run / "samples.jsonl"
    have = {r["id"] for r in _read_samples(path)}
    chunks = question_chunks(records, n, engine.config.batch_size)
    todo = [(c, chunk) for c, chunk in enumerate(chunks) if any(f"{r.id}#{k}" not in have for r in chunk for k in range(n))]
    if have:
        log.info("resuming RFT sampling: %d of %d chunks already in %s", len(chunks) - len(todo), len(chunks), path)
    with JsonlAppender(path) as out:
        for c, chunk in tqdm(todo, desc="rft sampling", unit="chunk", disable=not progress):
            expanded = [r for r in chunk for _ in range(n)]
            trajs = sample_chunk(engine, chunk, n, config.seed, c, config.sample_streams)
            for j, traj in enumerate(trajs):
                traj.metadata.update(sample=j % n, chunk=c)
            for row in judge_samples(trajs, expanded, scorer, engine.tokenizer, config):
                out.append(row)
    wanted = {f"{r.id}#{k}" for r in records for k in range(n)}
    rows = [r for r in _read_samples(path) if r["id"] in wanted]
    hops_of = {r.id: r.metadata["hops"] for r in records if isinstance(r.metadata.get("hops"), int)}
    counts = count_samples(rows, hops_of)
    write_jsonl(run / "kept.jsonl", (r for r in rows if r["kept_actions"]))
    write_json(run / "rft_counts.json", asdict(counts))
    log.info("RFT filters: %s", asdict(counts))
    return counts


# ----------------------------------------------------------------------------- fine-tuning


def finetune_rft(
    config: RFTConfig, run_dir: str | Path, model: Any, tokenizer: Any, samples: Sequence[Mapping[str, Any]]
) -> Path:
    """Fine-tune ``model`` on the kept samples with stage 1's trainer (the second half of the
    stage); resumes from the last checkpoint in ``run_dir/checkpoints``. Returns ``run_dir/policy``."""
    from prorag.models.tags import tag_token_ids

    run = Path(run_dir)
    train = replace(config.train, seed=config.seed)
    table = tag_weight_table(tag_token_ids(tokenizer), train.weight_scheme, train.control_lambda, weights=train.tag_weights)
    examples, stats = build_rft_examples(samples, table, max_length=train.max_length, overlong=train.overlong)
    log.info("RFT examples: %s", stats)
    out = run / "policy"
    if not examples:
        if config.if_nothing_kept == "error":
            raise ValueError(f"no kept (context, action) pair to train on ({stats}); see {run / 'rft_counts.json'}")
        log.warning("RFT kept no (context, action) pair (%s): pi_rft is pi_sft unchanged", stats)
        from prorag.models.checkpoints import save_policy
        from prorag.models.tags import configure_generation

        configure_generation(model, tokenizer)
        save_policy(model, tokenizer, out)
        return out
    trainer = make_sft_trainer(train, run, model, tokenizer, examples, None, table)
    resume_training(trainer, run, "RFT fine-tuning")
    save_trained_policy(trainer, tokenizer, out, merge_lora=train.lora.enabled)
    return out


# ----------------------------------------------------------------------------- the stage


def _check_resumable(run: Path, config: RFTConfig, prm_digest: str | None = None) -> None:
    """Refuse to resume a run whose samples were drawn or judged with other settings, or scored
    by another PRM (its weights' digest, when both runs know it: stored scores would mix)."""
    path = run / "rft_config.json"
    if not path.exists() or not (run / "samples.jsonl").exists():
        return
    before = read_json(path)
    now = config.sampling_settings()
    # A setting added after the run was made counts as what the runs before it did: its
    # LATER_FIELDS value (e.g. `sample_streams: batch`), else its default.
    defaults = RFTConfig().sampling_settings()
    # Inside a block (`rollout`), a LATER_FIELDS setting at its old-behaviour value is what the run had too.
    changed = sorted(
        k for k in now if without_later_fields(before.get(k, LATER_FIELDS.get(k, defaults[k]))) != without_later_fields(now[k])
    )
    if prm_digest is not None and before.get("prm_digest") not in (None, prm_digest):
        changed.append("the PRM (its weights differ)")
    if changed:
        raise ValueError(
            f"{run} holds samples drawn with other settings ({', '.join(changed)}); use a new run folder or the old settings"
        )


def run_rft(
    config: RFTConfig,
    run_dir: str | Path,
    *,
    model: Any,
    tokenizer: Any,
    records: Sequence[Record],
    retriever: Retriever,
    scorer: StepScorer | None = None,
    load_scorer: Callable[[], StepScorer] | None = None,
    sampler: RolloutEngine | None = None,
    prm_digest: str | None = None,
    progress: bool = True,
) -> Path:
    """Run the RFT stage in ``run_dir``: sample from ``model`` (pi_sft), filter by outcome and
    PRM, fine-tune ``model`` on the kept pairs; return the saved ``run_dir/policy`` (pi_rft).
    ``prm_digest`` (:meth:`~prorag.supervision.reward_model.ProcessRewardModel.digest`) names the PRM in
    ``rft_config.json``; resuming with another PRM is refused.

    Pass the PRM as ``scorer``, or a function that loads it as ``load_scorer``: then it is loaded
    for the sampling and released before the fine-tuning (a PRM is as large as the policy). ``sampler`` replaces the
    rollout engine over ``model`` (tests pass one over a scripted model). Resumes: complete
    sampling chunks are not redone, and fine-tuning continues from its last checkpoint.
    """
    if (scorer is None) == (load_scorer is None):
        raise ValueError("pass exactly one of scorer and load_scorer")
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    _check_resumable(run, config, prm_digest)
    write_json(run / "rft_config.json", {**asdict(config), "prm_digest": prm_digest})
    if sampler is None and config.rollout.backend != "hf":
        # A standalone engine (vLLM) samples beside the policy it fine-tunes next and the PRM that scores.
        check_gpu_share(config.rollout.vllm, RFT_GPU_SHARE, "the policy and the PRM", "RFTConfig")
    engine = sampler or RolloutEngine(model, tokenizer, retriever, config.rollout)
    prm = scorer if scorer is not None else load_scorer()  # type: ignore[misc]
    collect_rft_samples(config, run, engine, records, prm, progress=progress)
    del prm, engine  # a standalone engine's GPU memory goes back before the fine-tuning
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return finetune_rft(config, run, model, tokenizer, list(read_jsonl(run / "kept.jsonl")))


def run_rft_files(
    policy: str,
    prm: str,
    data: str | Path,
    index: str,
    run_dir: str | Path,
    config: RFTConfig | None = None,
    *,
    device: str | None = None,
) -> Path:
    """``prorag rft``: load pi_sft, the PRM, the records and the index, then :func:`run_rft`."""
    from prorag.models.checkpoints import load_policy
    from prorag.retrieval.index import open_retriever
    from prorag.supervision.reward_model import ProcessRewardModel

    cfg = config or RFTConfig()
    records, retriever = read_records(data), open_retriever(index)  # bad input refused before the model loads
    model, tokenizer = load_policy(policy, dtype=cfg.train.dtype, device=device)
    return run_rft(
        cfg,
        run_dir,
        model=model,
        tokenizer=tokenizer,
        records=records,
        retriever=retriever,
        load_scorer=lambda: ProcessRewardModel.load(prm, device=device),
        prm_digest=ProcessRewardModel.digest(prm),
    )


__all__ = [
    "RFTConfig",
    "RFTCounts",
    "build_rft_examples",
    "chunk_seed",
    "collect_rft_samples",
    "count_samples",
    "finetune_rft",
    "is_correct",
    "judge_samples",
    "kept_actions",
    "question_chunks",
    "rft_example",
    "rft_loss_mask",
    "run_rft",
    "run_rft_files",
    "sample_chunk",
    "sample_seed",
]
