"""The evaluation harness: run a policy (or a baseline) over a record file and score it.

Outputs, in the run's output folder:

* ``predictions.jsonl``: one line per question (id, prediction, gold answers, every answer
  metric, format validity, retrieval steps, gold-evidence recall when gold ids are known),
  appended and flushed batch by batch, so an interrupted evaluation resumes where it stopped;
* ``trajectories.jsonl``: the full token-level trajectories (ids, masks, spans, decoded text);
* ``metrics.json``: the means, named by metric (``em``, ``f1``, ``cover_em``, ``substring_acc``,
  never a containment metric called EM; ``rouge1_f1``, P2S's ROUGE-1; ``acc_l`` when a judge is set), the format-valid rate, mean retrieval steps, retrieval
  recall of gold evidence, EM on the yes/no questions beside a constant guess's (``yes_no_*``), and the distribution of retrieval steps with the F1 at each count and
  cumulatively (the data of ProRAG's Figure 6), and ``over_long_skipped`` / ``over_long_cut``.

The context budget (:mod:`prorag.agent.context_budget`): a question whose prompt leaves no room
for an action under the policy's maximum length is, by ``EvalConfig.over_long``, skipped (an empty
prediction scored 0 and marked ``skipped: "over_long"``, so the means stay over every question) or
cut to fit (marked ``cut: "over_long"``); both counted in ``metrics.json`` with one warning line.
A question is measured by its ProRAG prompt, also for the one-shot baselines (their documents uncounted).

:func:`compare_predictions` runs a paired t-test per metric between two prediction files.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from prorag.agent.context_budget import apply_budget, context_budget, warn_over_long
from prorag.agent.trajectory import Trajectory
from prorag.core.metrics import answer_metrics, retrieval_recall, rouge1_f1, yes_no_scores
from prorag.core.statistics import mean_and_spread, paired_t_test
from prorag.data.jsonl import JsonlAppender, read_jsonl, write_json
from prorag.data.records import Record
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig, GeneratorConfig  # noqa: F401  (re-exported: moved there)
from prorag.evaluation.step_errors import STEP_VALIDITY_RATES, step_validity_fields
from prorag.method.rewards.hiprag import SearchCounts
from prorag.retrieval.base import Retriever
from prorag.supervision.equivalence import equivalence_judge
from prorag.supervision.hiprag import REASK_ROLLOUT, batch_search_counts, reask, search_queries, trajectory_search_counts

log = logging.getLogger(__name__)

ANSWER_METRIC_NAMES = ("em", "f1", "cover_em", "substring_acc")


def score(
    record: Record,
    traj: Trajectory,
    prediction: str | None,
    reask_answers: dict[str, str | None] | None = None,
    counts: SearchCounts | None = None,
) -> dict[str, Any]:
    """One prediction line: answer metrics, validity, retrieval steps, gold-evidence recall and
    HiPRAG's step counts (:func:`search_step_fields`; ``counts`` when the batch was judged already)."""
    row: dict[str, Any] = {
        "id": record.id,
        "question": record.question,
        "golden_answers": record.golden_answers,
        "prediction": prediction,
        **answer_metrics(prediction or "", record.golden_answers),
        "rouge1_f1": rouge1_f1(prediction or "", record.golden_answers),
        "format_valid": bool(traj.valid),
        "retrieval_steps": traj.num_searches,
        "stop_reason": traj.stop_reason,
    }
    gold = record.metadata.get("gold_doc_ids") or []
    if gold:
        retrieved = [pid for r in traj.retrievals for pid in r["doc_ids"]]
        row["retrieval_recall"] = retrieval_recall(retrieved, gold, max(len(retrieved), 1))
    for key in ("type", "hops"):
        if key in record.metadata:
            row[key] = record.metadata[key]
    row.update(search_step_fields(record, traj, reask_answers, counts))
    row.update(step_validity_fields(record, traj.text))
    return row


def search_step_fields(
    record: Record, traj: Trajectory, reask_answers: dict[str, str | None] | None, counts: SearchCounts | None = None
) -> dict[str, int]:
    """HiPRAG's step counts of a trajectory (:mod:`prorag.supervision.hiprag`): ``search_steps`` and
    ``non_search_steps`` always; ``under_search`` where the record has a gold decomposition (the
    oracle decides); ``over_search`` only when the re-asked answers are given (sub-query -> answer)."""
    counts = counts or trajectory_search_counts(record, traj.text, reask_answers)
    fields = {"search_steps": counts.search, "non_search_steps": counts.non_search}
    if record.metadata.get("decomposition"):
        fields["under_search"] = counts.under
    if reask_answers is not None:
        fields["over_search"] = counts.over
    return fields


def step_rate(rows: Sequence[dict[str, Any]], count: str, steps: str) -> float | None:
    """``sum(count) / sum(steps)`` over the rows that have ``count`` (a rate over steps, not a mean of
    per-question rates, so long trajectories weigh by their steps); ``None`` without such steps."""
    have = [r for r in rows if count in r]
    total = sum(r.get(steps, 0) for r in have)
    return sum(r[count] for r in have) / total if total else None


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate prediction lines into ``metrics.json``."""
    if not rows:
        raise ValueError("no predictions to summarise")
    n = len(rows)
    out: dict[str, Any] = {"n": n}
    for name in ANSWER_METRIC_NAMES:
        out[name] = sum(r[name] for r in rows) / n
    rouge = [row_rouge1(r) for r in rows if "rouge1_f1" in r or "golden_answers" in r]
    out["rouge1_f1"] = sum(rouge) / n if len(rouge) == n else None
    for name in ("searches", "prompt_tokens", "completion_tokens"):
        if all(name in r for r in rows):
            out[f"mean_{name}"] = sum(r[name] for r in rows) / n
    out["format_valid_rate"] = sum(r["format_valid"] for r in rows) / n
    out["mean_retrieval_steps"] = sum(r["retrieval_steps"] for r in rows) / n
    with_gold = [r["retrieval_recall"] for r in rows if "retrieval_recall" in r]
    out["retrieval_recall"] = sum(with_gold) / len(with_gold) if with_gold else None
    out["over_search_rate"] = step_rate(rows, "over_search", "search_steps")
    out["under_search_rate"] = step_rate(rows, "under_search", "non_search_steps")
    # The oracle's verdicts on the steps (questions with gold decompositions; None elsewhere).
    for rate, (valid, judged) in STEP_VALIDITY_RATES.items():
        out[rate] = step_rate(rows, valid, judged)
    # EM on the yes/no questions beside a constant guess's (absent without such questions).
    out |= yes_no_scores((r["prediction"], r["golden_answers"]) for r in rows if "golden_answers" in r) or {}
    out["stop_reasons"] = dict(Counter(r["stop_reason"] for r in rows))
    out["over_long_skipped"] = sum(r.get("skipped") == "over_long" for r in rows)
    out["over_long_cut"] = sum(r.get("cut") == "over_long" for r in rows)
    out["retrieval_steps_distribution"] = steps_distribution(rows)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if "type" in r:
            by_type.setdefault(str(r["type"]), []).append(r)
    if by_type:
        out["by_type"] = {
            t: {"n": len(rs), "em": sum(x["em"] for x in rs) / len(rs), "f1": sum(x["f1"] for x in rs) / len(rs)}
            for t, rs in sorted(by_type.items())
        }
    out |= search_depth(rows)
    return out


def search_depth(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How deep the searches went against how deep the questions are, over the rows whose record
    gives its number of hops (built-in world, HotpotQA, MuSiQue; ``{}`` without such rows):

    - ``by_hops``: per hop count, ``n``, ``em``, ``f1`` and ``mean_retrieval_steps``;
    - ``searches_below_hops_rate``: the share of those questions answered after fewer searches
      than hops.

    The choice made: one search per hop is what the gold decompositions take, so fewer is an answer
    given before every hop was looked up. On the built-in world, whose facts no pretrained model
    holds, such an answer guesses at least one hop. It measures the horizon a policy keeps, which
    EM alone hides: a policy can stop searching long chains while its EM on them stays near zero
    either way, and self-training on correct answers (RFT, outcome RL) sees few long chains
    succeed. A trajectory level count; HiPRAG's ``under_search_rate`` judges single reasoning steps
    that were written without a search."""
    known = [r for r in rows if isinstance(r.get("hops"), int) and r["hops"] > 0]
    if not known:
        return {}
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in known:
        groups.setdefault(r["hops"], []).append(r)
    return {
        "by_hops": {
            str(h): {
                "n": len(rs),
                "em": sum(x["em"] for x in rs) / len(rs),
                "f1": sum(x["f1"] for x in rs) / len(rs),
                "mean_retrieval_steps": sum(x["retrieval_steps"] for x in rs) / len(rs),
            }
            for h, rs in sorted(groups.items())
        },
        "searches_below_hops_rate": sum(r["retrieval_steps"] < r["hops"] for r in known) / len(known),
    }


def row_rouge1(row: dict[str, Any]) -> float:
    """A prediction line's ROUGE-1 F1: its ``rouge1_f1``, or computed from its prediction and gold
    answers (lines written before the metric existed, or by a runner that does not add it), so
    every system's summary reports it."""
    if "rouge1_f1" in row:
        return float(row["rouge1_f1"])
    return rouge1_f1(row.get("prediction") or "", row["golden_answers"])


def steps_distribution(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per number of retrieval steps: count, coverage, F1 at that count, and cumulatively (Figure 6)."""
    n = len(rows)
    counts = Counter(r["retrieval_steps"] for r in rows)
    out, covered, f1_sum = [], 0, 0.0
    for steps in sorted(counts):
        at = [r["f1"] for r in rows if r["retrieval_steps"] == steps]
        covered += len(at)
        f1_sum += sum(at)
        out.append(
            {
                "steps": steps,
                "count": len(at),
                "f1": sum(at) / len(at),
                "coverage": covered / n,
                "cumulative_f1": f1_sum / covered,
            }
        )
    return out


def predicted_answer(traj: Trajectory, tokenizer: Any, *, baseline: bool = False) -> str | None:
    """The answer a rollout gives: the ``<answer>`` of a ProRAG trajectory; for a one-shot
    baseline, its ``<answer>`` or else its first line of text (an instruct model may answer
    without tags)."""
    from prorag.evaluation.baselines import baseline_answer

    return baseline_answer(traj.text, tokenizer) if baseline else traj.answer


def evaluate(
    model: Any,
    tokenizer: Any,
    records: Sequence[Record],
    retriever: Retriever,
    out_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``model`` on ``records``, resuming from ``out_dir`` if it holds earlier predictions."""
    cfg = config or EvalConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, todo = pending(records, out, cfg)
    pred_path, traj_path = out / "predictions.jsonl", out / "trajectories.jsonl"
    from prorag.agent.rollout import RolloutEngine  # the engine imports torch: not at import (--help)

    engine = RolloutEngine(model, tokenizer, retriever, cfg.rollout_config())
    by_id = {r.id: r for r in todo}
    budget = context_budget(model, tokenizer, engine.config)
    split = apply_budget(todo, tokenizer, budget, cfg.over_long, engine.config.prompt_style)
    warn_over_long("eval", split, len(todo), budget)
    runner = cfg.baseline_runner()
    judge = equivalence_judge(cfg.over_search_judge) if cfg.over_search else None
    with JsonlAppender(pred_path) as preds, JsonlAppender(traj_path) as trajs:
        for record in split.skipped:
            skipped = over_long_trajectory(record)
            trajs.append(skipped.to_dict())
            preds.append(score(record, skipped, None) | {"skipped": "over_long"})

        def write(batch: list[Trajectory]) -> None:
            answers: dict[str, str | None] | None = None
            counts: Sequence[SearchCounts | None] = [None] * len(batch)
            if judge is not None:
                queries = [q for t in batch for q in search_queries(t.text)]
                answers = reask(model, tokenizer, queries, replace(REASK_ROLLOUT, batch_size=cfg.rollout.batch_size))
                counts = batch_search_counts([by_id[t.id] for t in batch], [t.text for t in batch], answers, judge)
            for t, c in zip(batch, counts, strict=True):
                answer = runner.answer(t, tokenizer) if runner is not None else t.answer
                cut = {"cut": "over_long"} if t.id in split.cut else {}
                t.metadata.update(cut)
                trajs.append(t.to_dict())
                preds.append(score(by_id[t.id], t, answer, answers, c) | cut)

        if split.rollout and runner is not None:
            runner.run(engine, split.rollout, write, progress=progress)
        elif split.rollout:
            engine.rollout(split.rollout, progress=progress, on_batch=write)
    return finish(records, out, cfg)


def over_long_trajectory(record: Record) -> Trajectory:
    """The trajectory line of a question skipped by the context budget: nothing fed, nothing
    written (no ids, so the file does not hold the over-long prompt twice), stop reason ``over_long``."""
    return Trajectory(
        id=record.id,
        question=record.question,
        prompt_ids=[],
        completion_ids=[],
        env_mask=[],
        logprobs=[],
        actions=[],
        retrievals=[],
        stop_reason="over_long",
        metadata={"skipped": "over_long"},
    )


def pending(records: Sequence[Record], out: Path, cfg: EvalConfig) -> tuple[list[Record], list[Record]]:
    """The records of a run (``cfg.limit`` applied) and those not yet in ``out/predictions.jsonl``
    (a question already scored there is never run again: the resume of an interrupted run)."""
    records = list(records)[: cfg.limit] if cfg.limit is not None else list(records)
    pred_path = out / "predictions.jsonl"
    done = {row["id"] for row in read_jsonl(pred_path, tolerate_truncated_tail=True)} if pred_path.exists() else set()
    if done:
        log.info(
            "resuming: %d of %d questions already evaluated in %s", len(done & {r.id for r in records}), len(records), pred_path
        )
    return records, [r for r in records if r.id not in done]


def finish(
    records: Sequence[Record], out: Path, cfg: EvalConfig, means: Sequence[str] = (), totals: Sequence[str] = ()
) -> dict[str, Any]:
    """Summarise the prediction lines of ``records`` into ``out/metrics.json``, with ``mean_<key>``
    for each per-question count in ``means`` (e.g. ``completion_tokens``), the sum of each in
    ``totals`` (e.g. ``over_long_generations``) and the config."""
    wanted = {r.id for r in records}
    rows = [row for row in read_jsonl(out / "predictions.jsonl", tolerate_truncated_tail=True) if row["id"] in wanted]
    metrics = summarise(rows) | {f"mean_{k}": sum(r.get(k, 0) for r in rows) / len(rows) for k in means}
    metrics |= {k: sum(r.get(k, 0) for r in rows) for k in totals}
    metrics["config"] = asdict(cfg)
    write_json(out / "metrics.json", metrics)
    return metrics


def compare_predictions(a: str | Path, b: str | Path) -> dict[str, dict[str, float]]:
    """Paired t-test of per-question scores, per metric, over the questions both files share."""
    rows_a = {r["id"]: r for r in read_jsonl(a)}
    rows_b = {r["id"]: r for r in read_jsonl(b)}
    shared = sorted(rows_a.keys() & rows_b.keys())
    if len(shared) < 2:
        raise ValueError(f"{a} and {b} share {len(shared)} question ids; a paired test needs at least 2")
    out = {}
    for name in ANSWER_METRIC_NAMES:
        xa = [float(rows_a[i][name]) for i in shared]
        xb = [float(rows_b[i][name]) for i in shared]
        test = paired_t_test(xa, xb)
        out[name] = {
            "mean_a": mean_and_spread(xa)[0],
            "mean_b": mean_and_spread(xb)[0],
            "t": test.t,
            "p_value": test.p_value,
            "n": test.n,
        }
    return out
