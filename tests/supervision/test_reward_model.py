"""The process reward model as a scorer: left truncation keeps the step, the score is read at the
last real token whatever the padding (and the pad id), trajectories are scored per action span,
and a saved model reloads with the same scores; the likelihood kind reads beta * (mean log p - offset)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.core.errors import DataError
from prorag.models.checkpoints import save_policy
from prorag.models.tiny import make_tiny_model
from prorag.supervision.reward_model import (
    SETTINGS_FILE,
    ProcessRewardModel,
    StepScorer,
    last_token_rewards,
    length_batches,
    pad_batch,
    reward_model_from_policy,
    reward_probability,
    span_means,
    step_token_count,
    truncate_left,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, world_tokenizer: Any) -> Path:
    return save_policy(
        make_tiny_model(world_tokenizer, "tiny", seed=0), world_tokenizer, tmp_path_factory.mktemp("pi") / "policy"
    )


@pytest.fixture(scope="module")
def lik(policy_dir: Path) -> ProcessRewardModel:
    """The likelihood kind on the same policy, with a scale and a zero point that show up."""
    model, tok = reward_model_from_policy(policy_dir, kind="likelihood")
    return ProcessRewardModel(model.eval(), tok, max_length=64, kind="likelihood", beta=2.0, offset=-5.0)


@pytest.fixture(scope="module")
def prm(policy_dir: Path) -> ProcessRewardModel:
    model, tok = reward_model_from_policy(policy_dir, seed=0)
    # A head far from zero so that scores differ visibly between inputs.
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    return ProcessRewardModel(model.eval(), tok, max_length=64)


def _ids(n: int, start: int = 40) -> list[int]:
    return [start + (7 * i) % 300 for i in range(n)]


# ----------------------------------------------------------------------------- inputs


def test_truncate_left_keeps_the_step() -> None:
    assert truncate_left([1, 2, 3, 4], [5, 6], 10) == [1, 2, 3, 4, 5, 6]
    assert truncate_left([1, 2, 3, 4], [5, 6], 4) == [3, 4, 5, 6]
    assert truncate_left([1, 2, 3, 4], [5, 6], 2) == [5, 6]
    assert truncate_left([1, 2], [5, 6, 7], 2) == [6, 7]  # an over-long step keeps its end
    assert truncate_left([], [5], 3) == [5]
    with pytest.raises(ValueError):
        truncate_left([1], [2], 0)


def test_build_input_cuts_from_the_left_and_appends_eos(prm: ProcessRewardModel) -> None:
    context, step = _ids(100), _ids(10, start=500)
    ids = prm.build_input(context, step)
    assert len(ids) == 64 and ids[-10:] == step and ids[:54] == context[-54:]
    with_eos = ProcessRewardModel(prm.model, prm.tokenizer, max_length=64, append_eos=True)
    ids = with_eos.build_input(context, step)
    assert len(ids) == 64 and ids[-11:] == [*step, prm.tokenizer.eos_token_id]


def test_length_batches_go_longest_first() -> None:
    assert length_batches([3, 9, 1, 9, 5], 2) == [[1, 3], [4, 0], [2]]
    assert length_batches([], 4) == []


def test_pad_batch_both_sides() -> None:
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# ----------------------------------------------------------------------------- the read-out


def test_score_at_last_real_token_whatever_the_padding(prm: ProcessRewardModel) -> None:
    pad = prm.tokenizer.pad_token_id
    # The middle row ends with the pad id itself: transformers' own head (rightmost non-pad id)
    # would read it one token early; the mask-based read-out must not.
    rows = [_ids(12), [*_ids(5, start=90), pad], _ids(3, start=200)]
    with torch.no_grad():
        alone = torch.cat(
            [last_token_rewards(prm.model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows]
        )
        for side in ("right", "left"):
            ids, mask = pad_batch(rows, pad, side=side)
            assert torch.allclose(last_token_rewards(prm.model, ids, mask), alone, atol=1e-5), side
        hf = prm.model(input_ids=pad_batch(rows, pad)[0]).logits.squeeze(-1)
    assert not torch.isclose(hf[1], alone[1], atol=1e-4)  # the pitfall the read-out avoids
    assert len(set(alone.tolist())) == 3


def test_score_batches_and_keeps_the_order(prm: ProcessRewardModel) -> None:
    contexts = [_ids(n, start=40 + n) for n in (30, 3, 80, 0, 12)]
    steps = [_ids(n, start=400 + n) for n in (4, 9, 6, 2, 1)]
    batched = prm.score(contexts, steps, batch_size=2)
    one_by_one = torch.cat([prm.score([c], [s], batch_size=1) for c, s in zip(contexts, steps, strict=True)])
    assert batched.shape == (5,) and batched.dtype == torch.float32
    assert torch.allclose(batched, one_by_one, atol=1e-5)
    # The third input is longer than max_length: it is scored on its last 64 tokens.
    cut = prm.build_input(contexts[2], steps[2])
    assert prm.score([cut[:-6]], [cut[-6:]]).item() == pytest.approx(batched[2].item(), abs=1e-5)
    assert torch.allclose(prm.probabilities(contexts, steps), torch.sigmoid(batched), atol=1e-6)
    assert prm.score([], []).shape == (0,)
    with pytest.raises(ValueError, match="contexts"):
        prm.score([[1]], [])


def test_reward_probability_is_the_sigmoid() -> None:
    assert reward_probability([0.0, 2.0]).tolist() == pytest.approx([0.5, 1 / (1 + torch.e**-2)])


# ----------------------------------------------------------------------------- trajectories


def _trajectory(prompt: list[int], completion: list[int], spans: list[tuple[int, int]], kinds: list[str | None]) -> Trajectory:
    return Trajectory(
        id="q",
        question="q?",
        prompt_ids=prompt,
        completion_ids=completion,
        env_mask=[1] * len(completion),
        logprobs=[0.0] * len(completion),
        actions=[ActionRecord(k, s, k is not None) for k, s in zip(kinds, spans, strict=True)],
        retrievals=[],
        stop_reason="answer",
    )


def test_score_trajectories_uses_the_action_spans(prm: ProcessRewardModel) -> None:
    a = _trajectory(_ids(5), _ids(20, start=300), [(0, 6), (10, 15), (16, 20)], ["search", "conclude", None])
    b = _trajectory(_ids(4, start=77), _ids(8, start=600), [(1, 8)], ["answer"])
    empty = _trajectory(_ids(3), [], [], [])
    scores = prm.score_trajectories([a, empty, b])
    assert [len(s) for s in scores] == [3, 0, 1]
    expected = [
        prm.score([a.prompt_ids + a.completion_ids[:s]], [a.completion_ids[s:e]]).item() for s, e in [(0, 6), (10, 15), (16, 20)]
    ]
    assert scores[0] == pytest.approx(expected, abs=1e-5)
    assert scores[2] == pytest.approx(
        [prm.score([b.prompt_ids + b.completion_ids[:1]], [b.completion_ids[1:8]]).item()], abs=1e-5
    )
    # A different span gives a different score: the span, not the whole completion, is scored.
    assert scores[0][0] != pytest.approx(scores[0][1], abs=1e-4)


@pytest.mark.parametrize(("kind", "batch_size", "tol"), [("prm", 1, 1e-5), ("lik", 2, 1e-4)])
def test_score_trajectories_one_pass_equals_per_action_scoring(
    kind: str, batch_size: int, tol: float, request: pytest.FixtureRequest
) -> None:
    """Short trajectories are scored in one forward pass, long ones (over max_length = 64) action
    by action with the context cut from the left; both equal scoring each (context, step) alone,
    for the head (``prm``) and the likelihood kind (``lik``)."""
    scorer: ProcessRewardModel = request.getfixturevalue(kind)
    short = _trajectory(
        _ids(6, start=11), _ids(30, start=200), [(0, 0), (0, 7), (7, 19), (19, 30)], ["search", "search", "conclude", "answer"]
    )
    long = _trajectory(_ids(10, start=21), _ids(90, start=500), [(0, 30), (30, 60), (60, 90)], ["search", "conclude", "answer"])
    got = scorer.score_trajectories([short, long], batch_size=batch_size)
    for traj, row in zip([short, long], got):
        want = [
            scorer.score([traj.prompt_ids + traj.completion_ids[:s]], [traj.completion_ids[s:e]]).item()
            for s, e in (a.span for a in traj.actions)
        ]
        assert row == pytest.approx(want, abs=tol)


def test_span_means_hand_computed() -> None:
    values = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -4.0, -8.0, 0.0]], requires_grad=True)
    got = span_means(values, [0, 0, 1, 1], [1, 2, 1, 3], [4, 3, 3, 3])
    assert got.tolist() == pytest.approx([-2.0, -2.0, -6.0, 0.0])  # the last span is empty: 0
    got.sum().backward()  # differentiable: each entry of a span gets 1 / its length
    assert torch.allclose(values.grad, torch.tensor([[0, 1 / 3, 1 / 3 + 1, 1 / 3], [0, 1 / 2, 1 / 2, 0]]))
    assert span_means(values, [], [], []).shape == (0,)
    assert [step_token_count(n, L) for n, L in [(3, 10), (3, 3), (0, 5), (4, 1)]] == [3, 2, 0, 0]


def test_likelihood_kind_scores_beta_times_mean_logprob_minus_offset(lik: ProcessRewardModel, policy_dir: Path) -> None:
    """The likelihood kind's logit is beta * (mean log p(step | context) - offset), the mean
    taken by hand from the policy's own logits, whatever the batch and padding."""
    from prorag.models.checkpoints import load_policy

    policy, _ = load_policy(str(policy_dir))
    contexts, steps = [_ids(9), _ids(4, start=90), _ids(70)], [_ids(3, start=500), _ids(6, start=300), _ids(5, start=700)]
    got = lik.score(contexts, steps, batch_size=2)
    for i, (c, st) in enumerate(zip(contexts, steps)):
        ids = lik.build_input(c, st)
        with torch.no_grad():
            logp = torch.log_softmax(policy(torch.tensor([ids])).logits[0].float(), -1)
        n = len(st)
        mean = sum(logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]].item() for j in range(n)) / n
        assert got[i].item() == pytest.approx(2.0 * (mean + 5.0), abs=1e-4)
    # An empty step has no token to read: mean 0.
    assert lik.score([_ids(5)], [[]]).item() == pytest.approx(2.0 * 5.0)


def test_likelihood_kind_round_trip_and_errors(lik: ProcessRewardModel, tmp_path: Path) -> None:
    contexts, steps = [_ids(9), _ids(70)], [_ids(3, start=500), _ids(5, start=700)]
    out = lik.save(tmp_path / "prm")
    loaded = ProcessRewardModel.load(out)
    assert (loaded.kind, loaded.beta, loaded.offset) == ("likelihood", 2.0, -5.0)
    assert torch.allclose(loaded.score(contexts, steps), lik.score(contexts, steps), atol=1e-5)
    with pytest.raises(ValueError, match="append_eos"):
        ProcessRewardModel(lik.model, lik.tokenizer, kind="likelihood", append_eos=True)
    with pytest.raises(ValueError, match="unknown reward model kind"):
        ProcessRewardModel(lik.model, lik.tokenizer, kind="value")
    with pytest.raises(ValueError, match="beta"):
        ProcessRewardModel(lik.model, lik.tokenizer, kind="likelihood", beta=0.0)
    settings = json.loads((out / SETTINGS_FILE).read_text())
    (out / SETTINGS_FILE).write_text(json.dumps(settings | {"kind": "value"}))
    with pytest.raises(DataError, match="'kind'"):
        ProcessRewardModel.load(out)


def test_step_scorer_protocol(prm: ProcessRewardModel) -> None:
    class Fake:
        def score_trajectories(self, trajectories: Any) -> list[list[float]]:
            return [[0.0] * len(t.actions) for t in trajectories]

    assert isinstance(prm, StepScorer) and isinstance(Fake(), StepScorer)
    assert not isinstance(object(), StepScorer)


# ----------------------------------------------------------------------------- building and files


def test_backbone_is_copied_from_the_policy(policy_dir: Path) -> None:
    from prorag.models.checkpoints import load_policy

    policy, _ = load_policy(str(policy_dir))
    model, tok = reward_model_from_policy(policy_dir, seed=3)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(model.model.state_dict()[name], tensor), name
    again, _ = reward_model_from_policy(policy_dir, seed=3)
    assert torch.equal(again.score.weight, model.score.weight)  # the head is seeded


def test_save_and_load_round_trip(prm: ProcessRewardModel, tmp_path: Path) -> None:
    contexts, steps = [_ids(9), _ids(70)], [_ids(3, start=500), _ids(5, start=700)]
    out = prm.save(tmp_path / "prm")
    assert (out / SETTINGS_FILE).is_file() and any(out.glob("*.safetensors"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    loaded = ProcessRewardModel.load(out)
    assert loaded.max_length == 64 and not loaded.append_eos and not loaded.model.training
    assert torch.allclose(loaded.score(contexts, steps), prm.score(contexts, steps), atol=1e-6)
    prm.save(out)  # replacing an existing folder works
    assert ProcessRewardModel.load(tmp_path).max_length == 64  # a run folder stands for its prm/
    digest = ProcessRewardModel.digest(out)
    assert ProcessRewardModel.digest(tmp_path) == digest and len(digest) == 16
    with torch.no_grad():
        loaded.model.score.weight.add_(1.0)
    loaded.save(tmp_path / "other")
    assert ProcessRewardModel.digest(tmp_path / "other") != digest, "other weights, another digest"


def test_load_refuses_a_policy_folder(policy_dir: Path) -> None:
    from prorag.core.errors import DataError

    with pytest.raises(DataError, match="not a process reward model"):
        ProcessRewardModel.load(policy_dir)


def test_each_kind_is_its_own_class(prm: ProcessRewardModel, lik: ProcessRewardModel, tmp_path: Path) -> None:
    """``ProcessRewardModel(..., kind=...)`` and ``load`` give the class of the kind (PRM_KINDS);
    a class refuses another kind's name."""
    from prorag.supervision.reward_model import PRM_KINDS, HeadRewardModel, LikelihoodRewardModel

    assert PRM_KINDS.names() == ["head", "likelihood", "likelihood_ratio"]
    assert type(prm) is HeadRewardModel and type(lik) is LikelihoodRewardModel
    assert (prm.kind, lik.kind, prm.needs_zero_point, lik.needs_zero_point) == ("head", "likelihood", False, True)
    assert type(ProcessRewardModel.load(lik.save(tmp_path / "lik"))) is LikelihoodRewardModel
    assert type(LikelihoodRewardModel.load(prm.save(tmp_path / "head"))) is HeadRewardModel, "load follows the saved kind"
    with pytest.raises(ValueError, match="of kind 'head', not 'likelihood'"):
        HeadRewardModel(prm.model, prm.tokenizer, kind="likelihood")
    with pytest.raises(ValueError, match="likelihood kind has none"):
        lik.freeze_backbone()
    assert lik.summary() == {"kind": "likelihood", "likelihood_offset": -5.0} and prm.summary() == {"kind": "head"}


def test_likelihood_ratio_kind_is_zero_at_init_and_a_scaled_difference_after(policy_dir: Path, tmp_path: Path) -> None:
    """``likelihood_ratio``: beta * (mean log pi_phi(step) - mean log pi_ref(step)), pi_ref the
    init policy: 0 on every step before training; after a change to pi_phi, the difference of the
    two models' mean step log-probabilities (each read by the plain likelihood kind), times beta;
    gradients reach pi_phi only; the reference survives a save and load."""
    from prorag.supervision.reward_model import LikelihoodRatioRewardModel

    model, tok = reward_model_from_policy(policy_dir, kind="likelihood_ratio")
    ratio = ProcessRewardModel(model.eval(), tok, max_length=64, kind="likelihood_ratio", beta=2.0, reference=policy_dir)
    assert isinstance(ratio, LikelihoodRatioRewardModel) and not ratio.needs_zero_point
    contexts, steps = [_ids(9), _ids(4, start=120), _ids(15, start=7)], [_ids(3, start=300), _ids(6, start=60), [41]]
    assert ratio.score(contexts, steps).tolist() == [0.0, 0.0, 0.0]
    traj = _trajectory(_ids(5), _ids(12, start=90), [(0, 5), (5, 12)], ["search", "answer"])
    assert ratio.score_trajectories([traj]) == [[0.0, 0.0]]

    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ref_model, _ = reward_model_from_policy(policy_dir, kind="likelihood")
    own = ProcessRewardModel(model, tok, max_length=64, kind="likelihood").score(contexts, steps)
    ref = ProcessRewardModel(ref_model.eval(), tok, max_length=64, kind="likelihood").score(contexts, steps)
    got = ratio.score(contexts, steps)
    assert torch.allclose(got, 2.0 * (own - ref), atol=1e-5) and got.abs().min() > 1e-4
    one_pass = ratio.score_trajectories([traj])[0]
    per_action = ratio.score(
        [traj.prompt_ids, [*traj.prompt_ids, *traj.completion_ids[:5]]], [traj.completion_ids[:5], traj.completion_ids[5:]]
    )
    assert one_pass == pytest.approx(per_action.tolist(), abs=1e-5)

    ids, mask = pad_batch([[*contexts[0], *steps[0]]], tok.pad_token_id)
    ratio.pair_logits(model, ids, mask, [3]).sum().backward()
    assert any(p.grad is not None for p in model.parameters())
    assert all(p.grad is None for p in ratio.reference_model(ids.device).parameters())

    loaded = ProcessRewardModel.load(ratio.save(tmp_path / "ratio"))
    assert (loaded.kind, loaded.reference) == ("likelihood_ratio", str(policy_dir.resolve()))
    assert torch.allclose(loaded.score(contexts, steps), got, atol=1e-5)
    with pytest.raises(ValueError, match="needs `reference`"):
        ProcessRewardModel(model, tok, kind="likelihood_ratio").score(contexts, steps)


def test_target_logprobs_in_slices_equal_a_full_log_softmax() -> None:
    """Slices of any size (one that does not divide T included) give the full log-softmax's entries."""
    from prorag.supervision.reward_model import target_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 11, 17, dtype=torch.bfloat16)
    targets = torch.randint(0, 17, (3, 11))
    full = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    for chunk in (1, 4, 11, 64):
        torch.testing.assert_close(target_logprobs(logits, targets, chunk=chunk), full, rtol=0, atol=1e-5)


def test_token_logprobs_in_chunks_equal_the_full_logits(world_tokenizer: Any) -> None:
    """The LM head ``chunk`` tokens at a time gives the full logits' entries on real tokens (left and
    right padding), and their gradients; padding entries are 0."""
    from prorag.supervision.reward_model import token_logprobs

    model = make_tiny_model(world_tokenizer)
    ids = torch.randint(0, len(world_tokenizer), (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :3] = 0
    mask[2, 6:] = 0
    real = mask.bool() & (torch.arange(9) > mask.argmax(-1, keepdim=True))  # predicted real tokens
    results = []
    for chunk in (None, 4):
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(model, ids, mask, chunk=chunk)
        logp[real].sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (chunked, grads) = results
    torch.testing.assert_close(chunked[real], full[real], rtol=0, atol=1e-5)
    assert (chunked[~mask.bool()] == 0).all()
    for g, want in zip(grads, full_grads, strict=True):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6)
