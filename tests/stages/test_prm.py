"""The PRM stage: Eq. 4 on hand-computed numbers, the step-pairs reader's errors, the split by
question, and a tiny reward model trained for a few steps on synthetic pairs of the built-in
world (weights move, losses finite, held-out accuracy logged, scorer saved, runs resume)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import GoldTrajectory, render_gold
from prorag.agent.prompts import prompt_token_ids
from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.models.checkpoints import save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.prm import (
    PRMConfig,
    StepPair,
    held_out_scores,
    make_prm_trainer,
    pair_examples,
    pair_metrics,
    pair_wins,
    pairwise_loss,
    policy_step_likelihoods,
    read_step_pairs,
    separating_threshold,
    split_by_question,
    train_prm,
)
from prorag.supervision.reward_model import ProcessRewardModel, last_token_rewards, pad_batch, reward_model_from_policy

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- synthetic pairs


def synthetic_pairs(gold: list[GoldTrajectory], records: list[Record], tokenizer: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Step-pairs rows (contract 1) from gold trajectories: at every step the gold action is
    chosen and a corrupted sibling rejected. A conclusion is corrupted by putting another
    entity of the same relation in place of the gold sub-answer, in the thought and in the
    sub-answer (a claim the retrieved text does not support); a search after the first by
    repeating the previous search (redundant retrieval). The context is the prompt and every
    segment before the step, tokenised segment by segment as the rollout engine does."""
    rng = random.Random(seed)
    by_id = {r.id: r for r in records}
    pool: dict[str, set[str]] = {}
    for r in records:
        for hop in r.metadata.get("decomposition") or []:
            pool.setdefault(hop.get("relation", ""), set()).add(str(hop["answer"]))
    rows: list[dict[str, Any]] = []
    for traj in gold:
        hops = by_id[traj.id].metadata["decomposition"]
        context = prompt_token_ids(tokenizer, traj.question)
        conclude = search = 0
        previous_search: str | None = None
        for n, (text, by_model) in enumerate(traj.segments):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            rejected_text = None
            if by_model and "<subanswer>" in text and conclude < len(hops):
                answer = str(hops[conclude]["answer"])
                others = sorted(pool.get(hops[conclude].get("relation", ""), set()) - {answer})
                if others:
                    rejected_text = text.replace(answer, rng.choice(others))
                conclude += 1
            elif by_model and "<subquery>" in text:
                if previous_search is not None:
                    rejected_text = previous_search
                previous_search = text if text.startswith(" ") else text.replace("<step>", "", 1)
                search += 1
            if rejected_text is not None and rejected_text != text:
                rows.append(
                    {
                        "id": f"{traj.id}/{n}",
                        "question_id": traj.id,
                        "question": traj.question,
                        "partition": None,
                        "context_ids": list(context),
                        "chosen_ids": ids,
                        "rejected_ids": tokenizer(rejected_text, add_special_tokens=False)["input_ids"],
                        "context_text": tokenizer.decode(context),
                        "chosen_text": text,
                        "rejected_text": rejected_text,
                        "chosen_q": 1.0,
                        "chosen_n": 1,
                        "rejected_q": 0.0,
                        "rejected_n": 1,
                        "judge": "oracle",
                        "reason": "synthetic corruption",
                        "depth": n,
                    }
                )
            context = context + ids
    return rows


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer(world_tokenizer: Any) -> Any:
    return world_tokenizer


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")


@pytest.fixture(scope="module")
def gold(records: list[Record], tiny_retriever: BM25Retriever) -> list[GoldTrajectory]:
    return render_gold(records, tiny_retriever, k=3)


@pytest.fixture(scope="module")
def pair_rows(gold: list[GoldTrajectory], records: list[Record], tokenizer: Any) -> list[dict[str, Any]]:
    return synthetic_pairs(gold, records, tokenizer)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory, pair_rows: list[dict[str, Any]]) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    write_jsonl(path, pair_rows[:48])
    return path


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """A tiny random policy checkpoint (what `prorag sft` writes), the PRM's initialisation."""
    return save_policy(make_tiny_model(tokenizer, "tiny", seed=0), tokenizer, tmp_path_factory.mktemp("pi") / "policy")


def fast_config(**kw: Any) -> PRMConfig:
    base = dict(
        per_device_batch_size=4,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        warmup_ratio=0.0,
        logging_steps=1,
        save_steps=2,
        eval_steps=2,
        eval_batch_size=8,
        max_length=512,
        held_out_fraction=0.2,
    )
    return PRMConfig(**(base | kw))


# ----------------------------------------------------------------------------- the loss


def test_pairwise_loss_hand_computed() -> None:
    chosen = torch.tensor([2.0, 0.0, 1.0])
    rejected = torch.tensor([0.0, 1.0, 1.0])
    # -log sigmoid(d) = log(1 + exp(-d)) for d = 2, -1, 0.
    expected = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(1.0)) + math.log(2.0)) / 3
    assert pairwise_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.711112, abs=1e-6)  # (0.126928 + 1.313262 + 0.693147) / 3
    assert pair_wins(chosen, rejected).tolist() == [1.0, 0.0, 0.5]
    metrics = pair_metrics(chosen, rejected)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["margin"] == pytest.approx(1 / 3)
    # AUC of all chosen {2, 0, 1} against all rejected {0, 1, 1}: wins 2>0,2>1,2>1 (3), 0=0 (.5), 1>0, 1=1, 1=1 (2).
    assert metrics["auc"] == pytest.approx(5.5 / 9)
    # The loss pushes the chosen score up and the rejected one down.
    c, r = torch.tensor([0.0], requires_grad=True), torch.tensor([0.0], requires_grad=True)
    pairwise_loss(c, r).backward()
    assert c.grad.item() == pytest.approx(-0.5) and r.grad.item() == pytest.approx(0.5)


def test_trainer_loss_is_eq4_on_the_scorer_logits(policy_dir: Path, pair_rows: list[dict[str, Any]], tmp_path: Path) -> None:
    model, tok = reward_model_from_policy(policy_dir, seed=0)
    scorer = ProcessRewardModel(model, tok, max_length=512)
    pairs = [StepPair(r["id"], r["question_id"], r["context_ids"], r["chosen_ids"], r["rejected_ids"]) for r in pair_rows[:4]]
    examples, _ = pair_examples(pairs, scorer)
    trainer = make_prm_trainer(fast_config(), tmp_path, scorer, examples)
    batch = trainer.data_collator(examples)
    loss = trainer.compute_loss(trainer.model, dict(batch))
    contexts = [p.context_ids for p in pairs]
    chosen = scorer.score(contexts, [p.chosen_ids for p in pairs])
    rejected = scorer.score(contexts, [p.rejected_ids for p in pairs])
    assert loss.item() == pytest.approx(pairwise_loss(chosen, rejected).item(), rel=1e-5)
    # The batch is TRL's: chosen rows then rejected rows, right padded.
    ids, mask = pad_batch([e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples], tok.pad_token_id)
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
    with torch.no_grad():
        assert torch.allclose(last_token_rewards(model, ids, mask), torch.cat([chosen, rejected]), atol=1e-5)


# ----------------------------------------------------------------------------- the pairs file


def test_read_step_pairs_round_trip(pairs_file: Path, pair_rows: list[dict[str, Any]]) -> None:
    pairs = read_step_pairs(pairs_file)
    assert len(pairs) == 48
    assert pairs[0].chosen_ids == pair_rows[0]["chosen_ids"] and pairs[0].judge == "oracle"
    assert all(p.chosen_ids != p.rejected_ids for p in pairs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chosen_ids": [1, "x"]}, r"pairs.jsonl:2: field 'chosen_ids': item 1 is 'x'"),
        ({"rejected_ids": []}, r"pairs.jsonl:2: field 'rejected_ids': empty"),
        ({"context_ids": "1 2 3"}, r"pairs.jsonl:2: field 'context_ids': expected a list"),
        ({"question_id": None}, r"pairs.jsonl:2: field 'question_id': expected a non-empty string"),
        ({"rejected_ids": "SAME"}, r"pairs.jsonl:2: fields 'chosen_ids' and 'rejected_ids' are identical"),
        ({"id": "DUP"}, r"pairs.jsonl:2: field 'id': .* already used on line 1"),
    ],
)
def test_bad_pairs_line_names_file_line_and_field(
    tmp_path: Path, pair_rows: list[dict[str, Any]], change: dict[str, Any], message: str
) -> None:
    bad = dict(pair_rows[1])
    for key, value in change.items():
        bad[key] = {"SAME": bad["chosen_ids"], "DUP": pair_rows[0]["id"]}.get(value, value) if isinstance(value, str) else value
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, [pair_rows[0], bad])
    with pytest.raises(DataError, match=message):
        read_step_pairs(path)


def test_invalid_json_and_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"id": "a"\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:1: invalid JSON"):
        read_step_pairs(path)
    path.write_text("\n")
    with pytest.raises(DataError, match="no step pairs"):
        read_step_pairs(path)


def test_split_by_question_keeps_questions_whole(pair_rows: list[dict[str, Any]]) -> None:
    pairs = [StepPair(r["id"], r["question_id"], r["context_ids"], r["chosen_ids"], r["rejected_ids"]) for r in pair_rows]
    questions = {p.question_id for p in pairs}
    train, held = split_by_question(pairs, 0.2, seed=0)
    train_q, held_q = {p.question_id for p in train}, {p.question_id for p in held}
    assert not train_q & held_q and train_q | held_q == questions
    assert len(held_q) == round(0.2 * len(questions))
    assert len(train) + len(held) == len(pairs)
    again, held_again = split_by_question(pairs, 0.2, seed=0)
    assert [p.id for p in held_again] == [p.id for p in held]
    assert {p.question_id for p in split_by_question(pairs, 0.2, seed=1)[1]} != held_q
    assert split_by_question(pairs, 0.0, seed=0) == (pairs, [])
    two = [p for p in pairs if p.question_id in sorted(questions)[:2]]
    assert len({p.question_id for p in split_by_question(two, 0.01, seed=0)[1]}) == 1  # at least one held out


def test_token_ids_outside_the_vocabulary_are_refused(policy_dir: Path, pair_rows: list[dict[str, Any]]) -> None:
    model, tok = reward_model_from_policy(policy_dir)
    r = pair_rows[0]
    pair = StepPair(r["id"], r["question_id"], r["context_ids"], [len(tok) + 5], r["rejected_ids"])
    with pytest.raises(ValueError, match="outside the PRM tokenizer"):
        pair_examples([pair], ProcessRewardModel(model, tok))


# ----------------------------------------------------------------------------- training


def test_train_save_reload_and_resume(policy_dir: Path, pairs_file: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = fast_config(max_steps=4)
    out = train_prm(cfg, run, init=policy_dir, pairs=read_step_pairs(pairs_file))
    assert out == run / "prm"
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    rows = list(read_jsonl(run / "metrics.jsonl"))
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0 for r in train_rows)
    evals = [r for r in rows if "eval_loss" in r and "eval_auc" not in r]
    assert [r["step"] for r in evals] == [2, 4] and all(math.isfinite(r["eval_loss"]) for r in evals)
    final = rows[-1]
    assert {"eval_accuracy", "eval_loss", "eval_auc", "eval_pairs"} <= final.keys()
    assert 0.0 <= final["eval_policy_likelihood_accuracy"] <= 1.0 and 0.0 <= final["eval_policy_likelihood_auc"] <= 1.0
    held = set(json.loads((run / "split.json").read_text())["held_out_questions"])
    assert final["eval_pairs"] == sum(p.question_id in held for p in read_step_pairs(pairs_file))
    # The trainer's held-out numbers (last eval, same weights) equal the saved scorer's.
    assert final["eval_accuracy"] == pytest.approx(evals[-1]["eval_accuracy"])
    assert final["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], rel=1e-4)

    # The saved scorer reloads with its settings, and its weights moved from the initial ones.
    prm = ProcessRewardModel.load(run)
    assert prm.max_length == 512 and not prm.append_eos
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in out.iterdir())
    init, _ = reward_model_from_policy(policy_dir, seed=0)
    before, after = init.state_dict(), prm.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "score.weight" in changed and len(changed) >= len(before) // 2

    # Resume: ask for 6 steps in the same run directory; training continues at step 5.
    train_prm(fast_config(max_steps=6), run, init=policy_dir, pairs=read_step_pairs(pairs_file))
    rows = list(read_jsonl(run / "metrics.jsonl"))
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    state = json.loads((run / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend on the current token only (a fixed table),
    so that step log-probabilities can be computed by hand."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_policy_step_likelihood_is_the_mean_log_probability_of_the_step() -> None:
    # Vocabulary {0: pad, 1, 2, 3}; after token 1 the LM says 2 with p = 3/4, 3 with p = 1/4.
    table = torch.log(torch.tensor([[0.25] * 4, [1e-9, 1e-9, 0.75, 0.25], [0.1, 0.2, 0.3, 0.4], [0.25] * 4]))
    lm = BigramLM(table)
    contexts = [[3, 1], [3, 1], [2, 2, 2, 2, 2, 1]]
    steps = [[2], [3, 3], [2]]
    got = policy_step_likelihoods(lm, 0, contexts, steps, max_length=16, batch_size=2)
    want = torch.tensor([math.log(0.75), (math.log(0.25) + math.log(0.25)) / 2, math.log(0.75)])
    assert torch.allclose(got, want, atol=1e-5)
    # Cut from the left like the PRM's inputs: the step survives; a step that is the whole
    # input has no predicted token beyond the first, and an empty step scores 0.
    cut = policy_step_likelihoods(lm, 0, [[2, 2, 2, 2, 2, 1]], [[2]], max_length=2)
    assert cut.item() == pytest.approx(math.log(0.75), abs=1e-5)
    alone = policy_step_likelihoods(lm, 0, [[1], [1]], [[1, 2], []], max_length=2)
    assert alone[0].item() == pytest.approx(math.log(0.75), abs=1e-5) and alone[1].item() == 0.0


def test_separating_threshold_hand_computed() -> None:
    # Perfectly separable: the cut is halfway between the best rejected and the worst chosen.
    assert separating_threshold([3.0, 4.0], [1.0, 2.0]) == pytest.approx(2.5)
    # Sorted 1-, 3+, 3.5-, 4+, 5+: cutting at 2 (after 1 score) gets 4 of 5 right, at 3.25 3,
    # at 3.75 (after 3 scores) 4 again; the tie goes to the cut nearer the middle (2.5 scores).
    assert separating_threshold([3.0, 4.0, 5.0], [1.0, 3.5]) == pytest.approx(3.75)
    # Equal scores cannot be split: the only cuts are around the tied block.
    assert separating_threshold([1.0, 1.0], [1.0, 0.0]) == pytest.approx(0.5)
    # All chosen below all rejected: no cut beats putting everything on one side.
    assert separating_threshold([0.0], [1.0]) in (pytest.approx(-1.0), pytest.approx(2.0))
    assert separating_threshold([], []) == 0.0


def test_likelihood_kind_starts_at_the_policy_likelihood_and_trains(
    policy_dir: Path, pairs_file: Path, pair_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    """kind="likelihood": before training its logits are the policy's mean step log-probabilities
    (beta 1, offset 0); the trainer's loss is Eq. 4 on them; a few steps move the weights, fit a
    zero point on the training pairs and save a scorer that reloads as the same kind."""
    from prorag.models.checkpoints import load_policy

    model, tok = reward_model_from_policy(policy_dir, kind="likelihood")
    scorer = ProcessRewardModel(model, tok, max_length=512, kind="likelihood", beta=2.0)
    pairs = [StepPair(r["id"], r["question_id"], r["context_ids"], r["chosen_ids"], r["rejected_ids"]) for r in pair_rows[:6]]
    contexts = [p.context_ids for p in pairs]
    chosen = scorer.score(contexts, [p.chosen_ids for p in pairs])
    policy, _ = load_policy(str(policy_dir))
    base = policy_step_likelihoods(policy, tok.pad_token_id, contexts, [p.chosen_ids for p in pairs], max_length=512)
    assert torch.allclose(chosen, 2.0 * base, atol=1e-4)
    examples, _ = pair_examples(pairs, scorer)
    trainer = make_prm_trainer(fast_config(kind="likelihood", likelihood_beta=2.0), tmp_path / "t", scorer, examples)
    loss = trainer.compute_loss(trainer.model, dict(trainer.data_collator(examples)))
    rejected = scorer.score(contexts, [p.rejected_ids for p in pairs])
    assert loss.item() == pytest.approx(pairwise_loss(chosen, rejected).item(), rel=1e-4)

    run = tmp_path / "run"
    train_prm(fast_config(kind="likelihood", max_steps=4), run, init=policy_dir, pairs=read_step_pairs(pairs_file))
    rows = list(read_jsonl(run / "metrics.jsonl"))
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    final = rows[-1]
    assert final["kind"] == "likelihood" and math.isfinite(final["likelihood_offset"])
    prm = ProcessRewardModel.load(run)
    assert prm.kind == "likelihood" and prm.offset == pytest.approx(final["likelihood_offset"])
    before, after = policy.state_dict(), prm.model.state_dict()
    assert sum(not torch.equal(before[k], after[k]) for k in before) >= len(before) // 2
    # The zero point is the best cut of the training pairs' scores (with offset 0).
    held = set(json.loads((run / "split.json").read_text())["held_out_questions"])
    train_pairs = [p for p in read_step_pairs(pairs_file) if p.question_id not in held]
    prm.offset = 0.0
    c = prm.score([p.context_ids for p in train_pairs], [p.chosen_ids for p in train_pairs])
    r = prm.score([p.context_ids for p in train_pairs], [p.rejected_ids for p in train_pairs])
    assert final["likelihood_offset"] == pytest.approx(separating_threshold(c.tolist(), r.tolist()), abs=1e-4)


def test_validation_selection_keeps_the_earliest_best_weights(tmp_path: Path) -> None:
    """Validation accuracies 0.5 (step 0), 1.0 (step 2), 1.0 (step 4), 0.0 (step 6), the AUC
    1.0 at steps 2 and 4 too: the copy kept is the step-2 weights (strictly better replaces; a
    full tie keeps the earlier). Then a step with the same accuracy and a higher AUC wins."""
    from prorag.stages.prm import ValidationSelection

    class Scorer:
        def __init__(self) -> None:
            self.model = torch.nn.Linear(1, 1, bias=False)
            self.results = iter(
                [([1.0, 0.0], [0.0, 1.0]), ([1.0, 1.0], [0.0, 0.0]), ([2.0, 2.0], [0.0, 0.0]), ([0.0, 0.0], [1.0, 1.0])]
            )
            self.pending: list[float] = []

        def score(self, contexts: Any, steps: Any, batch_size: int = 32) -> torch.Tensor:
            if not self.pending:
                chosen, rejected = next(self.results)
                self.pending = list(rejected)
                return torch.tensor(chosen)
            out, self.pending = torch.tensor(self.pending), []
            return out

    scorer = Scorer()
    pairs = [StepPair("a", "q", [1], [2], [3]), StepPair("b", "q", [1], [4], [5])]
    sel = ValidationSelection(scorer, pairs, every=2, batch_size=4, path=tmp_path / "m.jsonl")  # type: ignore[arg-type]
    for step in (0, 2, 4, 6):
        with torch.no_grad():
            scorer.model.weight.fill_(float(step))
        sel.check(step, None, True)
    assert (sel.best_step, sel.best_accuracy) == (2, 1.0)
    assert sel.best_state is not None and sel.best_state["weight"].item() == 2.0
    rows = list(read_jsonl(tmp_path / "m.jsonl"))
    assert [(r["step"], r["validation_accuracy"]) for r in rows] == [(0, 0.5), (2, 1.0), (4, 1.0), (6, 0.0)]
    # Same accuracy (1/3), AUC 2/9 against 1.5/9: the AUC breaks the tie.
    sel = ValidationSelection(
        scorer, pairs + [StepPair("c", "q", [1], [6], [7])], every=2, batch_size=4, path=tmp_path / "n.jsonl"
    )  # type: ignore[arg-type]
    scorer.results = iter([([1.0, 0.0, 0.0], [0.5, 1.0, 2.0]), ([1.0, 0.4, 0.0], [0.5, 0.5, 2.0])])
    for step in (0, 2):
        sel.check(step, None, True)
    rows = list(read_jsonl(tmp_path / "n.jsonl"))
    assert (
        rows[0]["validation_accuracy"] == rows[1]["validation_accuracy"] and rows[1]["validation_auc"] > rows[0]["validation_auc"]
    )
    assert sel.best_step == 2


def test_train_with_a_validation_split_saves_the_best_validated_weights(
    policy_dir: Path, pairs_file: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = fast_config(max_steps=4, validation_fraction=0.25, kind="likelihood")
    train_prm(cfg, run, init=policy_dir, pairs=read_step_pairs(pairs_file))
    split = json.loads((run / "split.json").read_text())
    assert split["validation_questions"] and not set(split["validation_questions"]) & set(split["held_out_questions"])
    rows = list(read_jsonl(run / "metrics.jsonl"))
    checks = [r for r in rows if "validation_accuracy" in r and "eval_accuracy" not in r]
    assert [r["step"] for r in checks] == [0, 2, 4]
    final = rows[-1]
    best = max(checks, key=lambda r: (r["validation_accuracy"], -r["step"]))
    assert final["selected_step"] == best["step"] and final["validation_accuracy"] == pytest.approx(best["validation_accuracy"])
    # The saved scorer is the selected one: its validation accuracy is the best one logged.
    prm = ProcessRewardModel.load(run)
    val = [p for p in read_step_pairs(pairs_file) if p.question_id in set(split["validation_questions"])]
    got = pair_metrics(*held_out_scores(prm, val))["accuracy"]
    assert got == pytest.approx(best["validation_accuracy"])
    with pytest.raises(ValueError, match="validation_fraction"):
        PRMConfig(validation_fraction=1.0)


def test_no_pairs_stops_or_saves_an_untrained_prm(policy_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "pairs.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no step pairs"):
        train_prm(fast_config(pairs_file=str(empty)), tmp_path / "stop", init=policy_dir)
    out = train_prm(fast_config(pairs_file=str(empty), if_no_pairs="untrained"), tmp_path / "go", init=policy_dir)
    fresh, _ = reward_model_from_policy(policy_dir, seed=0)
    saved = ProcessRewardModel.load(out).model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())
    assert list(read_jsonl(tmp_path / "go" / "metrics.jsonl")) == [{"step": 0, "untrained": True, "pairs": 0}]


def test_head_only_training_freezes_the_backbone(policy_dir: Path, pairs_file: Path, tmp_path: Path) -> None:
    cfg = fast_config(max_steps=2, train_backbone=False, held_out_fraction=0.0, append_eos=True)
    prm = ProcessRewardModel.load(train_prm(cfg, tmp_path / "head", init=policy_dir, pairs=read_step_pairs(pairs_file)))
    assert prm.append_eos
    init, _ = reward_model_from_policy(policy_dir, seed=0)
    before, after = init.state_dict(), prm.model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == ["score.weight"]


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="held_out_fraction"):
        PRMConfig(held_out_fraction=1.0)
    with pytest.raises(ValueError, match="init"):
        train_prm(PRMConfig(), tmp_path, pairs=[])
    with pytest.raises(ValueError, match="pairs"):
        train_prm(PRMConfig(init="x"), tmp_path)


# ----------------------------------------------------------------------------- the command


def test_prm_command_trains_from_yaml_and_reports_bad_lines(policy_dir: Path, pairs_file: Path, tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from prorag.cli import app

    runner = CliRunner()
    cfg = tmp_path / "prm.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"per_device_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 256, "held_out_fraction": 0.2}
        )
    )
    run = tmp_path / "run"
    args = ["prm", "--pairs", str(pairs_file), "--init", str(policy_dir), "--run-dir", str(run), "--config", str(cfg)]
    result = runner.invoke(app, [*args, "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    assert ProcessRewardModel.load(run / "prm").max_length == 256
    assert json.loads((run / "prm_config.json").read_text())["pairs_file"] == str(pairs_file)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(pairs_file.read_text().replace('"chosen_ids": [', '"chosen_ids": [-1, ', 1))
    result = runner.invoke(app, ["prm", "--pairs", str(bad), "--init", str(policy_dir), "--run-dir", str(tmp_path / "r2")])
    assert result.exit_code == 2
    assert f"{bad}:1: field 'chosen_ids': item 0 is -1" in result.output
    cfg.write_text("epochs: three\n")
    result = runner.invoke(app, [*args[:-2], "--config", str(cfg)])
    assert result.exit_code == 2 and "prm.yaml:1" in result.output and "epochs" in result.output


def test_prm_audit_command_scores_fresh_samples(policy_dir: Path, pairs_file: Path, tiny_world: Path, tmp_path: Path) -> None:
    """`prorag prm-audit`: fresh pi_sft samples, oracle labels, the PRM's AUC beside the policy
    likelihood's; every step of every sample counted once."""
    from typer.testing import CliRunner

    from prorag.cli import app
    from prorag.retrieval.index import build_index

    train_prm(fast_config(max_steps=1), tmp_path / "run", init=policy_dir, pairs=read_step_pairs(pairs_file))
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index")
    out = tmp_path / "audit.json"
    args = ["prm-audit", "--prm", str(tmp_path / "run"), "--policy", str(policy_dir), "--data", str(tiny_world / "test.jsonl")]
    result = CliRunner().invoke(app, [*args, "--index", str(tmp_path / "index"), "--out", str(out), "--limit", "3"])
    assert result.exit_code == 0, result.output
    audit = json.loads(out.read_text())
    assert audit["trajectories"] <= 6 and audit["valid_steps"] + audit["invalid_steps"] > 0
    assert {"auc", "policy_likelihood_auc", "valid_above_0", "invalid_above_0", "within_question_auc"} <= audit.keys()
    assert "policy_likelihood_within_question_auc" in audit
    # The PRM run folder's verdict now rests on this audit, and says which policy, data and samples it was.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    auc = audit["auc"]  # NaN when three questions' samples hold one class only: the verdict says None
    assert summary["fresh_sample_auc"]["prm"] == (None if math.isnan(auc) else pytest.approx(auc))
    assert summary["audit_source"] == {
        "policy": str(policy_dir), "data": str(tiny_world / "test.jsonl"), "samples": 2, "limit": 3, "seed": 0, "file": str(out),
    }  # fmt: skip
    # --no-summary audits without touching the verdict.
    before = (tmp_path / "run" / "summary.json").read_text()
    other = tmp_path / "audit2.json"
    result = CliRunner().invoke(
        app, [*args, "--index", str(tmp_path / "index"), "--out", str(other), "--limit", "2", "--no-summary"]
    )
    assert result.exit_code == 0, result.output
    assert other.is_file() and (tmp_path / "run" / "summary.json").read_text() == before


def _audited_trajectory(kinds: tuple[str, ...] = ("search",) * 5) -> Any:
    """One trajectory of the judge tests' chain whose five actions the oracle labels valid, valid,
    invalid (a redundant search), invalid (an unsupported sub-answer), invalid (a right answer the
    history has not worked out)."""
    from prorag.agent.schema import render_conclude, render_env_turn, render_search, step_opener
    from prorag.agent.trajectory import ActionRecord, Trajectory
    from tests.supervision.test_judge import CHAIN

    docs = "Doc 1(Title: Saenax) Saenax was directed by Siril."
    text = (
        render_search("I need the director.", "Saenax director")  # valid
        + render_env_turn(docs)
        + render_conclude("Saenax was directed by Siril.", "Siril")[len(step_opener()) :]  # valid
        + render_env_turn()
        + render_search("Again.", "Saenax director")[len(step_opener()) :]  # invalid: redundant
        + render_env_turn(docs)
        + render_conclude("I guess.", "Tamal")[len(step_opener()) :]  # invalid: unsupported
        + render_env_turn()
        + " So the answer is Krirek. </step><answer> Krirek </answer>"  # invalid: right, but a guess
    )
    actions = [ActionRecord(kind, (0, 1), True) for kind in kinds]
    return Trajectory("w4-q1", CHAIN.question, [1], [2], [1], [0.0], actions, [], "answer", text=text)


def test_step_ranking_audit_pairs_oracle_labels_with_prm_logits() -> None:
    """Valid steps (oracle) scored 2, 1 and invalid ones 0, 3, -1: of the 6 (valid, invalid) score
    pairs the valid one wins 4 (2 and 1 each beat 0 and -1), so the AUC is 4/6."""
    from prorag.stages.prm import step_ranking_audit
    from tests.supervision.test_judge import CHAIN

    traj = _audited_trajectory()

    class Fake:
        def score_trajectories(self, trajectories: Any) -> list[list[float]]:
            return [[2.0, 1.0, 0.0, 3.0, -1.0] for _ in trajectories]

    audit = step_ranking_audit(Fake(), [traj], [CHAIN])
    assert (audit["valid_steps"], audit["invalid_steps"]) == (2, 3)
    assert audit["auc"] == pytest.approx(4 / 6)  # valid 2.0 and 1.0 each beat 0.0 and -1.0, lose to 3.0
    assert audit["valid_above_0"] == pytest.approx(1.0) and audit["invalid_above_0"] == pytest.approx(1 / 3)
    assert audit["within_question_auc"] == pytest.approx(4 / 6) and audit["within_question_pairs"] == 6
    # the oracle's first error is step 3 (index 2); the PRM's first logit below 0 is the last step
    assert (audit["first_error_same"], audit["first_error_prm_later"], audit["first_error_prm_earlier"]) == (0.0, 1.0, 0.0)


def test_step_ranking_audit_ranks_within_a_question_and_a_step_kind() -> None:
    """Two questions, the second's scores the first's plus 10: across questions the valid {2, 1, 12,
    11} beat the invalid {0, 3, -1, 10, 13, 9} in 2 + 2 + 5 + 5 = 14 of 24 pairs, but the advantage
    compares within a question, where each wins 4 of 6 (AUC 8/12). Within a step kind (search,
    conclude, search, conclude, answer) only search 2 > 0 (won) and conclude 1 < 3 (lost) pair up."""
    from dataclasses import replace

    from prorag.stages.prm import step_ranking_audit
    from tests.supervision.test_judge import CHAIN

    traj = _audited_trajectory(("search", "conclude", "search", "conclude", "answer"))
    base = [2.0, 1.0, 0.0, 3.0, -1.0]

    class Fake:
        def score_trajectories(self, trajectories: Any) -> list[list[float]]:
            return [[x + 10 * i for x in base] for i, _ in enumerate(trajectories)]

    audit = step_ranking_audit(Fake(), [traj, traj], [CHAIN, replace(CHAIN, id="other")])
    assert audit["auc"] == pytest.approx(14 / 24)
    assert audit["within_question_auc"] == pytest.approx(8 / 12) and audit["within_question_pairs"] == 12
    assert audit["within_question_kind_auc"] == pytest.approx(0.5) and audit["within_question_kind_pairs"] == 4
    # first errors: oracle at index 2; PRM none below 0 in question 1 (later), none in question 2 either
    assert audit["first_error_prm_later"] == 1.0

    class Early:
        def score_trajectories(self, trajectories: Any) -> list[list[float]]:
            return [[-1.0, 1.0, 0.5, 0.5, 0.5], [1.0, 1.0, -0.5, -2.0, 1.0]][: len(trajectories)]

    first = step_ranking_audit(Early(), [traj, traj], [CHAIN, CHAIN])  # PRM's first error at 0, then at 2
    assert (first["first_error_prm_earlier"], first["first_error_same"], first["first_error_prm_later"]) == (0.5, 0.5, 0.0)
    one = step_ranking_audit(Fake(), [traj], [CHAIN])  # the first question alone: its two same-kind pairs
    assert one["within_question_kind_pairs"] == 2 and one["within_question_kind_auc"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- pointwise labels, a larger backbone, the verdict


def test_prm_loss_adds_a_weighted_cross_entropy_on_the_pointwise_labels() -> None:
    """Pairs (2, 0) and (0, 1): Eq. 4 is (log(1 + e^-2) + log(1 + e)) / 2. Points: logit 0 with
    label 1 costs log 2, logit ln 3 with label 0 costs -log(1 - 3/4) = log 4; their mean is
    1.5 log 2. Weight 0.5 adds 0.75 log 2; weight 0 is Eq. 4 alone; without pairs the BCE alone."""
    from prorag.stages.prm import prm_loss

    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    logits, labels = torch.tensor([0.0, math.log(3.0)]), torch.tensor([1.0, 0.0])
    eq4 = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.e)) / 2
    assert eq4 == pytest.approx(0.720095, abs=1e-6)  # (0.126928 + 1.313262) / 2
    assert prm_loss(chosen, rejected, logits, labels, 0.5).item() == pytest.approx(eq4 + 0.75 * math.log(2), rel=1e-6)
    assert prm_loss(chosen, rejected, logits, labels, 0.0).item() == pytest.approx(eq4, rel=1e-6)
    empty = torch.zeros(0)
    assert prm_loss(empty, empty, logits, labels, 2.0).item() == pytest.approx(3 * math.log(2), rel=1e-6)
    assert prm_loss(chosen, rejected, empty, empty, 1.0).item() == pytest.approx(eq4, rel=1e-6)


def _points(pair_rows: list[dict[str, Any]]) -> list[Any]:
    """Pointwise labels from the synthetic pairs: each chosen step valid, each rejected one invalid."""
    from prorag.stages.prm import PointStep

    out = []
    for r in pair_rows:
        out.append(PointStep(r["id"] + "/c", r["question_id"], r["context_ids"], r["chosen_ids"], 1))
        out.append(PointStep(r["id"] + "/r", r["question_id"], r["context_ids"], r["rejected_ids"], 0))
    return out


def test_trainer_loss_on_a_mixed_batch_is_eq4_plus_the_cross_entropy(
    policy_dir: Path, pair_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    from prorag.stages.prm import point_examples, prm_loss

    model, tok = reward_model_from_policy(policy_dir, seed=0)
    scorer = ProcessRewardModel(model, tok, max_length=512)
    pairs = [StepPair(r["id"], r["question_id"], r["context_ids"], r["chosen_ids"], r["rejected_ids"]) for r in pair_rows[:3]]
    points = _points(pair_rows[3:5])
    examples = pair_examples(pairs, scorer)[0] + point_examples(points, scorer)
    trainer = make_prm_trainer(fast_config(), tmp_path, scorer, examples, pointwise_weight=0.7)
    loss = trainer.compute_loss(trainer.model, dict(trainer.data_collator(examples[::-1])))  # order within a batch is free
    contexts = [p.context_ids for p in pairs]
    chosen = scorer.score(contexts, [p.chosen_ids for p in pairs])
    rejected = scorer.score(contexts, [p.rejected_ids for p in pairs])
    point_logits = scorer.score([p.context_ids for p in points[::-1]], [p.step_ids for p in points[::-1]])
    labels = torch.tensor([float(p.label) for p in points[::-1]])
    expected = prm_loss(chosen.flip(0), rejected.flip(0), point_logits, labels, 0.7)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() > pairwise_loss(chosen, rejected).item()


def test_a_larger_prm_backbone_trains_and_scores_rl_steps(
    policy_dir: Path, pairs_file: Path, pair_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``backbone_size: small`` beside a tiny policy: a fresh 256-wide model on the policy's
    tokenizer, trained with the pointwise term (finite losses, weights moved), saved, and loaded
    by the RL stage's ``prm`` step-reward source, which scores every action of a trajectory."""
    from prorag.agent.trajectory import ActionRecord, Trajectory
    from prorag.method.rewards.sources import STEP_REWARD_SOURCES
    from prorag.stages.rl import RLConfig
    from prorag.supervision.reward_model import reward_model_of_size

    config = fast_config(max_steps=3, backbone_size="small", seed=0)
    out = train_prm(config, tmp_path / "run", init=policy_dir, pairs=read_step_pairs(pairs_file), points=_points(pair_rows[:48]))
    saved = json.loads((tmp_path / "run" / "prm_config.json").read_text())
    assert saved["pointwise_weight"] == 1.0 and saved["backbone_size"] == "small"
    losses = [r["loss"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    prm = ProcessRewardModel.load(out)
    assert prm.model.config.hidden_size == 256
    fresh, _ = reward_model_of_size(policy_dir, "small", seed=0)
    assert fresh.config.hidden_size == 256
    trained, initial = prm.model.state_dict(), fresh.state_dict()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial), "training moved the weights"

    source = STEP_REWARD_SOURCES.get("prm")(RLConfig(prm=str(tmp_path / "run"), prm_batch_size=4))
    row = pair_rows[0]
    completion = [*row["chosen_ids"], *row["rejected_ids"]]
    cut = len(row["chosen_ids"])
    traj = Trajectory(
        "q", "q?", row["context_ids"], completion, [1] * len(completion), [0.0] * len(completion),
        [ActionRecord("search", (0, cut), True), ActionRecord("search", (cut, len(completion)), True)], [], "answer",
    )  # fmt: skip
    scores = source([traj])
    assert len(scores) == 1 and len(scores[0]) == 2 and all(math.isfinite(x) for x in scores[0])
    assert scores[0][0] == pytest.approx(prm.score([row["context_ids"]], [row["chosen_ids"]]).item(), abs=1e-4)


def test_likelihood_verdict_says_which_checks_the_prm_beats(tmp_path: Path) -> None:
    from prorag.stages.prm import likelihood_verdict, write_prm_summary

    held = {"eval_accuracy": 0.9, "eval_auc": 0.8, "eval_policy_likelihood_accuracy": 0.86, "eval_policy_likelihood_auc": 0.88}
    verdict = likelihood_verdict(held, {"auc": 0.91, "policy_likelihood_auc": 0.87})
    assert verdict["held_out_accuracy"] == {"prm": 0.9, "likelihood": 0.86, "beats": True}
    assert verdict["held_out_auc"]["beats"] is False and verdict["fresh_sample_auc"]["beats"] is True
    assert verdict["beats_all"] is False
    better = held | {"eval_auc": 0.95}
    assert likelihood_verdict(better, {"auc": 0.91, "policy_likelihood_auc": 0.87})["beats_all"] is True
    # A tie beats nothing; a missing audit or a NaN is unknown, never a win.
    assert likelihood_verdict(better, {"auc": 0.87, "policy_likelihood_auc": 0.87})["fresh_sample_auc"]["beats"] is False
    # Float noise is no win either: the demo's untrained likelihood PRM against the likelihood (margin 0.01).
    noise = {"auc": 0.8854017216642754, "policy_likelihood_auc": 0.8853833405533013}
    assert likelihood_verdict(better, noise)["fresh_sample_auc"]["beats"] is False
    assert likelihood_verdict(better, noise, margin=0.0)["fresh_sample_auc"]["beats"] is True
    missing = likelihood_verdict(better, None)
    assert missing["fresh_sample_auc"] == {"prm": None, "likelihood": None, "beats": None} and missing["beats_all"] is False
    assert likelihood_verdict(better | {"eval_auc": float("nan")}, None)["held_out_auc"]["beats"] is None
    # The run folder's summary.json: the last held-out row and the audit beside it.
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n" + json.dumps(better) + "\n")
    (tmp_path / "audit.json").write_text(json.dumps({"auc": 0.5, "policy_likelihood_auc": 0.87}))
    written = write_prm_summary(tmp_path)
    assert written["fresh_sample_auc"]["beats"] is False and written["audit_source"] == {"file": "audit.json"}
    assert json.loads((tmp_path / "summary.json").read_text())["held_out_auc"]["prm"] == 0.95


def test_pointwise_and_backbone_settings_are_checked(policy_dir: Path, pairs_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pointwise_weight > 0 needs kind 'head'"):
        PRMConfig(kind="likelihood", pointwise_weight=1.0)
    with pytest.raises(ValueError, match="backbone_size must be one of"):
        PRMConfig(backbone_size="huge")
    with pytest.raises(ValueError, match="backbone_size needs kind 'head'"):
        PRMConfig(kind="likelihood", backbone_size="small")
    with pytest.raises(ValueError, match="pointwise_weight must be >= 0"):
        PRMConfig(pointwise_weight=-1.0)
    # The likelihood kind leaves labels beside the pairs unused by default (Eq. 4 alone).
    from prorag.stages.prm import resolve_pointwise

    points_path = pairs_file.with_name("pairs.pointwise.jsonl")
    points_path.write_text(json.dumps({"id": "a", "question_id": "q", "context_ids": [1], "step_ids": [2], "label": 1}) + "\n")
    try:
        assert resolve_pointwise(PRMConfig(kind="likelihood", pairs_file=str(pairs_file)), None) == ([], 0.0)
        points, weight = resolve_pointwise(PRMConfig(pairs_file=str(pairs_file)), None)
        assert weight == 1.0 and [p.id for p in points] == ["a"]
        assert resolve_pointwise(PRMConfig(pairs_file=str(pairs_file), pointwise_weight=0.0), None) == ([], 0.0)
        points_path.write_text(
            json.dumps({"id": "a", "question_id": "q", "context_ids": [1], "step_ids": [2], "label": 2}) + "\n"
        )
        with pytest.raises(DataError, match=r"pairs.pointwise.jsonl:1.*field 'label'"):
            resolve_pointwise(PRMConfig(pairs_file=str(pairs_file)), None)
    finally:
        points_path.unlink()
