"""The process reward model R_phi: a scalar score of one reasoning step in its context (docs/METHOD.md §2).

Default kind: the policy backbone (copied from ``pi_sft``) with a new bias-free ``hidden -> 1`` head
(``*ForSequenceClassification``, ``num_labels=1``); input ``context + step``, one logit read on the
step's last real token. Choices: the read-out position comes from the attention mask, not the pad
id (pad is EOS in SmolLM2; :func:`last_token_rewards` scores a row alike however padded); long
inputs are cut from the left (:func:`truncate_left`) so the step survives; ``append_eos`` (off)
reproduces the reference code's EOS read-out and is saved with the model.

``kind="likelihood"`` keeps the LM head: ``beta * (mean log p(step) - offset)``, SimPO's length-normalised
implicit reward, trained with the same Eq. 4 loss (MCTS siblings are the policy's own samples, so its
likelihood already ranks them well); ``offset`` is fitted after training so that RFT's ``logit > 0`` keeps
its meaning. ``kind="likelihood_ratio"`` (:class:`LikelihoodRatioRewardModel`) scores against the frozen
init policy. Saved as a transformers folder plus ``reward_model.json``; :meth:`ProcessRewardModel.load`
serves RFT and RL through :meth:`~ProcessRewardModel.score_trajectories` (:class:`StepScorer`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from prorag.core.lazy_modules import lazy_module
from prorag.core.registry import Registry, unknown_name
from prorag.method.rewards.process import StepScorer

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_module("torch")


if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from prorag.agent.trajectory import Trajectory

log = logging.getLogger(__name__)

#: The file beside the weights that says how inputs are built.
SETTINGS_FILE = "reward_model.json"
#: Longest input (context + step) in tokens: the reference code's ``max_seq_length``.
DEFAULT_MAX_LENGTH = 4096


# ----------------------------------------------------------------------------- inputs


def truncate_left(context: Sequence[int], step: Sequence[int], max_length: int) -> list[int]:
    """``context + step`` cut from the left to at most ``max_length`` tokens.

    The step is what is scored, so it is kept whole and the context loses its oldest tokens
    first (a long history is dropped before the recent retrieval the step builds on). If the
    step alone is longer than ``max_length`` its last ``max_length`` tokens are kept: the end
    of the step, where the score is read, always survives.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    ids = [*context, *step]
    return [int(t) for t in ids[-max_length:]]


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``sequences`` padded with ``pad_id`` on ``side``
    (``"right"`` or ``"left"``) to the longest one."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    if not sequences:
        raise ValueError("pad_batch needs at least one sequence")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        n = len(s)
        if n == 0:
            raise ValueError(f"sequence {i} is empty")
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        ids[i, cols] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of inputs grouped ``batch_size`` at a time, longest first: each batch pads its
    rows to nearly the same length, and the first batch shows at once whether the longest
    input fits in memory."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


# ----------------------------------------------------------------------------- the read-out


def last_token_rewards(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The scalar head on the hidden state of each row's last real token: ``(B,)`` float32 logits.

    ``model`` is a transformers sequence-classification model (backbone under
    ``model.base_model_prefix``, head ``model.score``). The last real token is the last
    position whose ``attention_mask`` is 1, wherever the padding is, and whatever the pad id is.
    Position ids count real tokens only (``cumsum(mask) - 1``), so left padding shifts nothing
    and a padded row computes exactly what it would alone. The head runs on the ``B`` chosen
    hidden states only, not on every position.
    """
    backbone = getattr(model, model.base_model_prefix)
    mask = attention_mask.to(input_ids.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = backbone(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
    index = torch.arange(mask.shape[-1], device=mask.device)
    last = (index * mask).argmax(-1)
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]
    return model.score(picked).squeeze(-1).float()


def action_end_rewards(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: Sequence[Sequence[int]]
) -> list[list[float]]:
    """The scalar head at chosen positions of each row (right-padded): ``positions[b]`` lists
    the token indices of row ``b`` to read. With a causal backbone the hidden state at index
    ``p`` depends on tokens ``0..p`` only, so reading it equals scoring the prefix ``0..p`` alone
    (:func:`last_token_rewards` on that prefix), for every position at the price of one pass."""
    backbone = getattr(model, model.base_model_prefix)
    mask = attention_mask.to(input_ids.device)
    pos_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = backbone(input_ids=input_ids, attention_mask=mask, position_ids=pos_ids, use_cache=False).last_hidden_state
    rows = torch.tensor([b for b, ps in enumerate(positions) for _ in ps], dtype=torch.long, device=hidden.device)
    cols = torch.tensor([p for ps in positions for p in ps], dtype=torch.long, device=hidden.device)
    flat = model.score(hidden[rows, cols]).squeeze(-1).float().cpu().tolist() if len(cols) else []
    return split_rows(flat, [len(ps) for ps in positions])


def split_rows(flat: Sequence[float], sizes: Sequence[int]) -> list[list[float]]:
    """``flat`` cut into consecutive rows of ``sizes`` (the per-row layout of values computed in
    one flat batch)."""
    out: list[list[float]] = []
    at = 0
    for n in sizes:
        out.append(list(flat[at : at + n]))
        at += n
    return out


def token_logprobs(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk: int | None = None
) -> torch.Tensor:
    """``(B, T)`` float32: entry ``t`` is ``log p(input_ids[:, t] | input_ids[:, :t])`` under the
    causal LM ``model`` (entry 0, which nothing predicts, is 0). Position ids count real tokens
    only, as in :func:`last_token_rewards`, so any padding leaves the real entries unchanged.
    ``chunk``: the real tokens through the LM head ``chunk`` at a time, without the ``(B, T, V)``
    logits (:func:`~prorag.models.logprobs.causal_lm_label_logprobs`; padding entries are then 0);
    ``None``: the full logits."""
    mask = attention_mask.to(input_ids.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if chunk is not None:
        from prorag.models.logprobs import causal_lm_label_logprobs

        labels = input_ids.masked_fill(mask == 0, -100)
        logp = causal_lm_label_logprobs(model, input_ids, labels, chunk=chunk, attention_mask=mask, position_ids=positions)
        return torch.nn.functional.pad(logp, (1, 0))
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, :-1]
    return torch.nn.functional.pad(target_logprobs(logits, input_ids[:, 1:]), (1, 0))


#: Positions per slice in :func:`target_logprobs` (float32 copies of at most this many rows of logits).
LOGPROB_CHUNK = 256


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk: int = LOGPROB_CHUNK) -> torch.Tensor:
    """``(B, T)`` float32 ``log softmax(logits)[..., targets]`` for ``logits`` ``(B, T, V)``, a slice
    of ``chunk`` positions at a time: ``logit[target] - logsumexp(logits)``, so only one slice is
    ever copied to float32 and no ``(B, T, V)`` log-softmax is materialised (a batch of 32
    trajectories of 900 tokens over a 49k vocabulary would take 5.5 GB in float32)."""
    out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[1], chunk):
        piece = logits[:, start : start + chunk].float()
        picked = piece.gather(-1, targets[:, start : start + chunk, None]).squeeze(-1)
        out[:, start : start + chunk] = picked - torch.logsumexp(piece, dim=-1)
    return out


def span_means(values: torch.Tensor, rows: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> torch.Tensor:
    """``(N,)``: the mean of ``values[rows[i], starts[i]:ends[i]]`` for each ``i`` (0 for an empty
    span), from one cumulative sum, so it stays differentiable and costs no Python loop."""
    if not len(rows):
        return values.new_zeros(0)
    csum = torch.nn.functional.pad(values.cumsum(-1), (1, 0))
    r = torch.as_tensor(list(rows), dtype=torch.long, device=values.device)
    a = torch.as_tensor(list(starts), dtype=torch.long, device=values.device)
    b = torch.as_tensor(list(ends), dtype=torch.long, device=values.device)
    n = (b - a).clamp(min=0)
    total = csum[r, b.clamp(min=a)] - csum[r, a]
    return torch.where(n > 0, total / n.clamp(min=1).to(values.dtype), torch.zeros_like(total))


def step_token_count(step_length: int, input_length: int) -> int:
    """How many of a step's tokens a likelihood can be read on, the step being the last
    ``step_length`` tokens of an input of ``input_length``: all but a first token of the input
    (which nothing predicts), and none of an empty step."""
    return max(0, min(int(step_length), int(input_length) - 1))


def likelihood_rewards(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    step_lengths: Sequence[int] | torch.Tensor,
    *,
    beta: float = 1.0,
    offset: float = 0.0,
) -> torch.Tensor:
    """The ``likelihood`` kind's logits ``(B,)``: ``beta * (mean log p(step) - offset)``, the step
    being the last ``step_lengths[b]`` real tokens of row ``b`` (right padding); a step with no
    readable token (:func:`step_token_count`) has mean 0."""
    lengths = attention_mask.sum(-1).tolist()
    counts = [step_token_count(int(n), int(L)) for n, L in zip(list(step_lengths), lengths, strict=True)]
    logp = token_logprobs(model, input_ids, attention_mask)
    ends = [int(L) for L in lengths]
    means = span_means(logp, range(len(ends)), [e - c for e, c in zip(ends, counts, strict=True)], ends)
    return float(beta) * (means - float(offset))


def action_likelihoods(
    model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: Sequence[int], actions: Spans
) -> tuple[Tensor, list[int]]:
    """The mean log-probability of every action ``(start, end)`` (completion coordinates) of each
    row, a whole trajectory of ``prompt_lengths[b]`` prompt tokens, from one forward pass (never
    the input's first token, which nothing predicts): a flat ``(N,)`` tensor and each row's count."""
    spans = [[(max(1, p + a), p + b) for a, b in row] for p, row in zip(prompt_lengths, actions, strict=True)]
    logp = token_logprobs(model, input_ids, attention_mask)
    rows = [b for b, row in enumerate(spans) for _ in row]
    means = span_means(logp, rows, [a for row in spans for a, _ in row], [b for row in spans for _, b in row])
    return means, [len(row) for row in spans]


def reward_probability(logits: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """``sigmoid(logit)``: the probability that a step is the better one of a pair (the
    Bradley-Terry reading of the pairwise loss; RFT keeps steps above 0.5, i.e. logit > 0)."""
    return torch.sigmoid(torch.as_tensor(logits, dtype=torch.float32))


# ----------------------------------------------------------------------------- building one


def model_folder(path: str | os.PathLike[str]) -> Path:
    """The reward model folder ``path`` names: itself, or the ``prm/`` of a ``prorag prm`` run."""
    folder = Path(path)
    if not (folder / SETTINGS_FILE).is_file() and (folder / "prm" / SETTINGS_FILE).is_file():
        return folder / "prm"
    return folder


def reward_model_from_policy(
    policy: str | os.PathLike[str], *, dtype: str | torch.dtype = "float32", seed: int = 0, kind: str = "head"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh reward model of ``kind`` (:data:`PRM_KINDS`) on a policy checkpoint (or a training
    run folder), built by that kind's :meth:`ProcessRewardModel.model_from_policy`."""
    return PRM_KINDS.get(kind).model_from_policy(policy, dtype=dtype, seed=seed)


def reward_model_of_size(
    policy: str | os.PathLike[str], size: str, *, dtype: str | torch.dtype = "float32", seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A head-kind reward model on a *fresh* built-in backbone of ``size`` (a
    :data:`~prorag.models.tiny.TINY_SIZES` name), not the policy's: the policy's tokenizer (so the
    pairs' token ids mean the same), its architecture (``llama`` or ``qwen3``), and weights drawn
    by :func:`~prorag.models.tiny.make_tiny_model` with ``seed``, as SFT draws the policy before
    training it. This lets the PRM be larger than the policy it judges; it starts without the
    policy's knowledge of the world, which only its own training gives it."""
    from prorag.models.checkpoints import as_dtype, load_policy
    from prorag.models.tiny import make_tiny_model

    causal, tokenizer = load_policy(str(policy), dtype=dtype)
    arch = causal.config.model_type
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"backbone_size builds a built-in llama or qwen3 model; the policy at {policy} is a {arch!r} model")
    del causal
    fresh = make_tiny_model(tokenizer, size, arch=arch, seed=seed)
    if isinstance(as_dtype(dtype), torch.dtype):  # "auto": the float32 it was drawn in
        fresh = fresh.to(as_dtype(dtype))
    return HeadRewardModel.head_on(fresh, tokenizer, seed=seed), tokenizer


# ----------------------------------------------------------------------------- the scorers


#: The ``(start, end)`` spans of each row's actions (completion coordinates), and one score per action.
Spans = Sequence[Sequence[tuple[int, int]]]
Scores = list[list[float]]


class ProcessRewardModel:
    """R_phi with its tokenizer and input settings: batched scoring of (context, step) pairs.

    The shared plumbing (inputs, batching, :meth:`score_trajectories`, save and load) lives
    here; how a logit is read is a subclass's, one per kind in :data:`PRM_KINDS`:
    :class:`HeadRewardModel` (``"head"``, the paper) and :class:`LikelihoodRewardModel`
    (``"likelihood"``). ``ProcessRewardModel(model, tokenizer, kind=...)`` builds the subclass of
    ``kind`` (default ``"head"``), and :meth:`load` the one of the saved kind, so callers never
    branch on the kind. ``max_length`` bounds every input (:func:`truncate_left`);
    ``append_eos`` appends the tokenizer's EOS after the step and reads the score there;
    ``beta`` and ``offset`` are the likelihood kind's scale and zero point (saved by every kind);
    ``reference`` the policy the PRM started from (saved when set, as an absolute path), which
    the ratio kind compares with.
    """

    #: The name of the kind in :data:`PRM_KINDS` and in the saved settings.
    kind: ClassVar[str] = ""
    #: Whether :meth:`fit_zero_point` has anything to fit (the pairwise loss sets no zero point).
    needs_zero_point: ClassVar[bool] = False

    def __new__(cls, *args: Any, kind: str | None = None, **kwargs: Any) -> ProcessRewardModel:
        if cls is ProcessRewardModel:
            cls = PRM_KINDS.get(kind or "head")
        return object.__new__(cls)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        append_eos: bool = False,
        kind: str | None = None,
        beta: float = 1.0,
        offset: float = 0.0,
        reference: str | os.PathLike[str] | None = None,
    ) -> None:
        if kind is not None and kind != self.kind:
            raise ValueError(f"a {type(self).__name__} is of kind {self.kind!r}, not {kind!r}")
        self.check_settings(append_eos=append_eos, beta=beta)
        if append_eos and tokenizer.eos_token_id is None:
            raise ValueError("append_eos needs a tokenizer with an EOS token")
        if tokenizer.pad_token_id is None:
            raise ValueError("the reward model's tokenizer needs a pad token")
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.append_eos = bool(append_eos)
        self.beta = float(beta)
        self.offset = float(offset)
        self.reference = str(reference) if reference is not None else None

    # ---- what a kind defines

    @classmethod
    def check_settings(cls, *, append_eos: bool, beta: float) -> None:
        """``ValueError`` for settings this kind cannot use (also checked by ``PRMConfig``)."""
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")

    @classmethod
    def model_from_policy(
        cls, policy: str | os.PathLike[str], *, dtype: str | torch.dtype = "float32", seed: int = 0
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """A fresh model of this kind on the policy checkpoint ``policy``, to train."""
        raise NotImplementedError

    @classmethod
    def model_from_folder(cls, folder: Path, dtype: str | torch.dtype) -> PreTrainedModel:
        """The model of a folder written by :meth:`save`."""
        raise NotImplementedError

    def pair_logits(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]
    ) -> torch.Tensor:
        """``(B,)`` logits of right-padded rows whose steps are their last ``step_lengths`` tokens,
        with gradients, under ``model`` (the trainer's, possibly wrapped): what Eq. 4 sees."""
        raise NotImplementedError

    def batch_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]) -> torch.Tensor:
        """``(B,)`` scores of right-padded rows (:meth:`pair_logits` with the fitted zero point)."""
        return self.pair_logits(self.model, input_ids, attention_mask, step_lengths)

    def action_logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: Sequence[int], actions: Spans) -> Scores:
        """The score of every action ``(start, end)`` (completion coordinates) of each row, a
        whole trajectory of ``prompt_lengths[b]`` prompt tokens, from one forward pass."""
        raise NotImplementedError

    def freeze_backbone(self) -> None:
        """Train the head alone (``PRMConfig.train_backbone=False``)."""
        raise ValueError(f"train_backbone=False trains a head alone; the {self.kind} kind has none")

    def fit_zero_point(self, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
        """Place the logit's 0 from the chosen and rejected training steps' scores (a no-op for a
        kind whose zero point the loss already sets, :attr:`needs_zero_point` False)."""

    def summary(self) -> dict[str, Any]:
        """What the PRM stage logs about the trained scorer (its kind, a fitted zero point)."""
        return {"kind": self.kind}

    # ---- inputs

    def build_input(self, context: Sequence[int], step: Sequence[int]) -> list[int]:
        """The ids the model scores for one (context, step): ``context + step (+ EOS)`` cut from the left."""
        tail = [*step, int(self.tokenizer.eos_token_id)] if self.append_eos else list(step)
        ids = truncate_left(context, tail, self.max_length)
        if not ids:
            raise ValueError("nothing to score: both the context and the step are empty")
        return ids

    # ---- scoring

    def score(self, contexts: Sequence[Sequence[int]], steps: Sequence[Sequence[int]], batch_size: int = 32) -> torch.Tensor:
        """The logit R_phi(context_i, step_i) of every pair: a ``(N,)`` float32 CPU tensor.

        Inputs are sorted by length and scored ``batch_size`` at a time (padded on the right:
        little padding per batch), and the logits returned in the given order. An empty step is
        read on the last context token (every action of a trajectory gets a logit; the
        likelihood kind gives it a mean of 0).
        """
        with torch.inference_mode():
            if len(contexts) != len(steps):
                raise ValueError(f"{len(contexts)} contexts but {len(steps)} steps")
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            inputs = [self.build_input(c, s) for c, s in zip(contexts, steps, strict=True)]
            out = torch.empty(len(inputs), dtype=torch.float32)
            if not inputs:
                return out
            was_training = self.model.training
            self.model.eval()
            device = next(self.model.parameters()).device
            try:
                for rows in length_batches([len(x) for x in inputs], batch_size):
                    ids, mask = pad_batch([inputs[i] for i in rows], int(self.tokenizer.pad_token_id))
                    logits = self.batch_logits(ids.to(device), mask.to(device), [len(steps[i]) for i in rows])
                    out[torch.tensor(rows)] = logits.cpu()
            finally:
                self.model.train(was_training)
            return out

    def probabilities(
        self, contexts: Sequence[Sequence[int]], steps: Sequence[Sequence[int]], batch_size: int = 32
    ) -> torch.Tensor:
        """:func:`reward_probability` of :meth:`score`."""
        return reward_probability(self.score(contexts, steps, batch_size))

    def score_trajectories(self, trajectories: Sequence[Trajectory], batch_size: int = 32) -> list[list[float]]:
        """One logit per action of each trajectory, actions of every kind (``None`` included).

        Action ``a`` of trajectory ``y`` is scored with context ``y.prompt_ids +
        y.completion_ids[:a.span[0]]`` (everything before it, retrieval text included) and step
        ``y.completion_ids[a.span[0]:a.span[1]]``.

        The PRM is causal, so the input of action ``a`` is a prefix of the trajectory and its
        score can be read from one forward pass over the trajectory (:meth:`action_logits`),
        instead of one pass per action over an ever longer context. That is exact whenever no
        input needs cutting and no EOS is appended; other trajectories (longer than
        ``max_length``, or with ``append_eos``) go through :meth:`score` action by action.
        """
        out: list[list[float] | None] = [None] * len(trajectories)
        whole: list[int] = []
        for i, traj in enumerate(trajectories):
            if not traj.actions:
                out[i] = []
                continue
            end = max(a.span[1] for a in traj.actions)
            if not self.append_eos and 0 < len(traj.prompt_ids) + end <= self.max_length:
                whole.append(i)
        if whole:
            for i, row in zip(whole, self._score_in_one_pass([trajectories[i] for i in whole], batch_size), strict=True):
                out[i] = row
        rest = [i for i in range(len(trajectories)) if out[i] is None]
        contexts: list[list[int]] = []
        steps: list[list[int]] = []
        for i in rest:
            traj = trajectories[i]
            for action in traj.actions:
                start, end = action.span
                contexts.append([*traj.prompt_ids, *traj.completion_ids[:start]])
                steps.append(list(traj.completion_ids[start:end]))
        flat = self.score(contexts, steps, batch_size).tolist()
        for i, row in zip(rest, split_rows(flat, [len(trajectories[i].actions) for i in rest]), strict=True):
            out[i] = row
        return [row or [] for row in out]

    def _score_in_one_pass(self, trajectories: Sequence[Trajectory], batch_size: int) -> list[list[float]]:
        """Every action of each trajectory from one forward pass over the trajectory."""
        with torch.inference_mode():
            inputs = [[*t.prompt_ids, *t.completion_ids[: max(a.span[1] for a in t.actions)]] for t in trajectories]
            was_training = self.model.training
            self.model.eval()
            device = next(self.model.parameters()).device
            out: list[list[float]] = [[] for _ in trajectories]
            try:
                for rows in length_batches([len(x) for x in inputs], batch_size):
                    ids, mask = pad_batch([inputs[i] for i in rows], int(self.tokenizer.pad_token_id))
                    prompts = [len(trajectories[i].prompt_ids) for i in rows]
                    actions = [[a.span for a in trajectories[i].actions] for i in rows]
                    for i, row in zip(rows, self.action_logits(ids.to(device), mask.to(device), prompts, actions), strict=True):
                        out[i] = row
            finally:
                self.model.train(was_training)
            return out

    # ---- files

    def save(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the model folder atomically (as :func:`~prorag.models.checkpoints.save_policy` does a policy):
        safetensors weights, config, tokenizer and :data:`SETTINGS_FILE`, built in a temporary
        folder beside ``out_dir`` and renamed into place; an existing ``out_dir`` is replaced."""
        from prorag.models.checkpoints import save_checkpoint

        settings = {
            "max_length": self.max_length,
            "append_eos": self.append_eos,
            "kind": self.kind,
            "beta": self.beta,
            "offset": self.offset,
        }
        if self.reference is not None:
            settings["reference"] = str(Path(self.reference).resolve())
        return save_checkpoint(
            self.model, self.tokenizer, out_dir, extra_files={SETTINGS_FILE: json.dumps(settings, indent=2) + "\n"}
        )

    @staticmethod
    def digest(path: str | os.PathLike[str]) -> str:
        """A short SHA-256 of a saved PRM's weight files (a :meth:`load`-able folder): what a stage
        that stores PRM scores records, so that resuming with another PRM is refused rather than
        mixing two models' scores."""
        from prorag.models.checkpoints import weights_digest

        folder = model_folder(path)
        digest = weights_digest(folder)
        if digest is None:
            from prorag.core.errors import DataError

            raise DataError(str(folder), "no *.safetensors weights of a process reward model")
        return digest

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], device: str | None = None, *, dtype: str | torch.dtype = "auto"
    ) -> ProcessRewardModel:
        """Load a folder written by :meth:`save` (or a ``prorag prm`` run folder: its ``prm/``),
        as the class of its saved kind, in eval mode, on ``device`` (default: CPU)."""
        from transformers import AutoTokenizer

        from prorag.core.errors import DataError
        from prorag.data.safetensors_files import check_folder

        folder = model_folder(path)
        settings_path = folder / SETTINGS_FILE
        if not settings_path.is_file():
            raise DataError(str(folder), f"not a process reward model folder (no {SETTINGS_FILE})")
        settings: dict[str, Any] = json.loads(settings_path.read_text(encoding="utf-8"))
        kind = settings.get("kind", "head")
        if kind not in PRM_KINDS:
            raise DataError(str(settings_path), f"field 'kind': {unknown_name(PRM_KINDS.what, kind, PRM_KINDS.names())}")
        kind_class = PRM_KINDS.get(kind)
        check_folder(folder, remedy="restore the folder or train the PRM again")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = kind_class.model_from_folder(folder, dtype)
        if device is not None:
            model.to(device)
        model.eval()
        return kind_class(
            model,
            tokenizer,
            max_length=int(settings["max_length"]),
            append_eos=bool(settings.get("append_eos", False)),
            beta=float(settings.get("beta", 1.0)),
            offset=float(settings.get("offset", 0.0)),
            reference=settings.get("reference"),
        )


#: The kinds of process reward model, by the name saved in :data:`SETTINGS_FILE`.
PRM_KINDS: Registry[type[ProcessRewardModel]] = Registry("reward model kind")


@PRM_KINDS.register("head")
class HeadRewardModel(ProcessRewardModel):
    """The paper's R_phi: the policy's backbone with a new scalar head, read on the step's last
    token (or on an appended EOS, ``append_eos``)."""

    kind: ClassVar[str] = "head"

    @classmethod
    def model_from_policy(
        cls, policy: str | os.PathLike[str], *, dtype: str | torch.dtype = "float32", seed: int = 0
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The policy is loaded with :func:`~prorag.models.checkpoints.load_policy` (so the tags are registered
        and the pad token set exactly as for the policy), then its backbone weights are copied
        into an ``AutoModelForSequenceClassification`` of the same config with ``num_labels=1``;
        the causal LM head is dropped. The new head is drawn under ``torch.manual_seed(seed)`` in
        a forked RNG (same seed, same head; the caller's random state is untouched)."""
        from prorag.models.checkpoints import load_policy

        causal, tokenizer = load_policy(str(policy), dtype=dtype)
        return cls.head_on(causal, tokenizer, seed=seed), tokenizer

    @staticmethod
    def head_on(causal: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0) -> PreTrainedModel:
        """An ``AutoModelForSequenceClassification`` (``num_labels=1``) of ``causal``'s config with
        ``causal``'s backbone weights and a new head drawn under ``torch.manual_seed(seed)``."""
        from transformers import AutoModelForSequenceClassification

        config = causal.config
        config.num_labels = 1
        config.pad_token_id = tokenizer.pad_token_id
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(config, dtype=causal.dtype)
        backbone = getattr(model, model.base_model_prefix)
        backbone.load_state_dict(getattr(causal, causal.base_model_prefix).state_dict(), strict=True)
        return model

    @classmethod
    def model_from_folder(cls, folder: Path, dtype: str | torch.dtype) -> PreTrainedModel:
        """A sequence-classification model with one label (a ``DataError`` otherwise)."""
        from transformers import AutoModelForSequenceClassification

        from prorag.core.errors import DataError
        from prorag.models.checkpoints import as_dtype

        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=as_dtype(dtype))
        if getattr(model.config, "num_labels", None) != 1:
            raise DataError(str(folder / "config.json"), f"field 'num_labels': expected 1, got {model.config.num_labels}")
        return model

    def pair_logits(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]
    ) -> torch.Tensor:
        """The head on each row's last real token (:func:`last_token_rewards`)."""
        return last_token_rewards(model, input_ids, attention_mask)

    def action_logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: Sequence[int], actions: Spans) -> Scores:
        """The head at each action's last token (:func:`action_end_rewards`); an empty action is
        read on the token before it, as :meth:`score` reads an empty step."""
        reads = [[p + end - 1 for _, end in row] for p, row in zip(prompt_lengths, actions, strict=True)]
        return action_end_rewards(self.model, input_ids, attention_mask, reads)

    def freeze_backbone(self) -> None:
        """No gradient to the backbone: the head alone trains."""
        getattr(self.model, self.model.base_model_prefix).requires_grad_(False)


@PRM_KINDS.register("likelihood")
class LikelihoodRewardModel(ProcessRewardModel):
    """The policy's causal LM as R_phi: a step scores ``beta * (mean log p(step) - offset)``
    (see the module docstring); the zero point ``offset`` is fitted after training."""

    kind: ClassVar[str] = "likelihood"
    needs_zero_point: ClassVar[bool] = True

    @classmethod
    def check_settings(cls, *, append_eos: bool, beta: float) -> None:
        """No ``append_eos`` (there is no head to read on it), and ``beta > 0``."""
        if append_eos:
            raise ValueError("append_eos reads a head on an appended EOS; the likelihood kind reads the step's own tokens")
        super().check_settings(append_eos=append_eos, beta=beta)

    @classmethod
    def model_from_policy(
        cls, policy: str | os.PathLike[str], *, dtype: str | torch.dtype = "float32", seed: int = 0
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The policy itself, causal LM head kept (its config says ``num_labels=1``, which TRL's
        reward trainer checks and a causal LM ignores); ``seed`` is unused (nothing is drawn)."""
        from prorag.models.checkpoints import load_policy

        causal, tokenizer = load_policy(str(policy), dtype=dtype)
        causal.config.num_labels = 1
        causal.config.pad_token_id = tokenizer.pad_token_id
        return causal, tokenizer

    @classmethod
    def model_from_folder(cls, folder: Path, dtype: str | torch.dtype) -> PreTrainedModel:
        """A causal LM."""
        from transformers import AutoModelForCausalLM

        from prorag.models.checkpoints import as_dtype

        return AutoModelForCausalLM.from_pretrained(folder, dtype=as_dtype(dtype))

    def pair_logits(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]
    ) -> torch.Tensor:
        """``beta * mean log p(step)`` (:func:`likelihood_rewards`): the zero point does not enter Eq. 4."""
        return likelihood_rewards(model, input_ids, attention_mask, list(step_lengths), beta=self.beta)

    def batch_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]) -> torch.Tensor:
        """``beta * (mean log p(step) - offset)``."""
        return likelihood_rewards(self.model, input_ids, attention_mask, step_lengths, beta=self.beta, offset=self.offset)

    def action_logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: Sequence[int], actions: Spans) -> Scores:
        """Each action's tokens' mean log-probability (:func:`action_likelihoods`), scaled and
        shifted, from one pass."""
        means, sizes = action_likelihoods(self.model, input_ids, attention_mask, prompt_lengths, actions)
        return split_rows((self.beta * (means - self.offset)).cpu().tolist(), sizes)

    def fit_zero_point(self, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
        """``offset``: where the training pairs' chosen and rejected steps part best
        (:func:`separating_threshold` of their scores, read back as a mean log-probability)."""
        self.offset = separating_threshold(chosen.tolist(), rejected.tolist()) / self.beta
        log.info("likelihood PRM: zero point at mean log-probability %.4f (fitted on the training pairs)", self.offset)

    def summary(self) -> dict[str, Any]:
        return {"kind": self.kind, "likelihood_offset": self.offset}


@PRM_KINDS.register("likelihood_ratio")
class LikelihoodRatioRewardModel(LikelihoodRewardModel):
    """The likelihood kind as a ratio to the init policy: a step scores ``beta * (mean log
    pi_phi(step) - mean log pi_ref(step))`` (see the module docstring), 0 for every step at
    initialisation. pi_ref is the policy folder ``reference`` (the PRM stage's ``init``, saved
    as an absolute path in the settings), loaded once, frozen, on the model's device; Eq. 4 trains
    pi_phi alone (pi_ref's terms carry no gradient). 0 is the ratio's own zero point (as likely
    as under pi_sft): no offset is fitted.

    Why a ratio: the plain likelihood kind that keeps near-initial weights gives, to first order,
    log pi_sft(step), whose policy gradient in RL pulls the policy back to pi_sft (a -KL - entropy
    term); the ratio is 0 at initialisation and carries only what Eq. 4 taught."""

    kind: ClassVar[str] = "likelihood_ratio"
    needs_zero_point: ClassVar[bool] = False

    def reference_model(self, device: torch.device) -> PreTrainedModel:
        """pi_ref on ``device``, loaded with :func:`~prorag.models.checkpoints.load_policy` on first use."""
        ref = getattr(self, "_reference_model", None)
        if ref is None:
            if not self.reference:
                raise ValueError("the likelihood_ratio kind needs `reference`: the init policy (pi_sft) folder")
            from prorag.models.checkpoints import load_policy

            ref, _ = load_policy(self.reference)
            ref.requires_grad_(False).eval()
            self._reference_model = ref
        return ref.to(device)

    def pair_logits(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]
    ) -> torch.Tensor:
        """``beta * (mean log pi_phi(step) - mean log pi_ref(step))``, gradients through pi_phi only."""
        own = likelihood_rewards(model, input_ids, attention_mask, list(step_lengths))
        with torch.no_grad():
            ref = likelihood_rewards(self.reference_model(input_ids.device), input_ids, attention_mask, list(step_lengths))
        return self.beta * (own - ref)

    def batch_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_lengths: Sequence[int]) -> torch.Tensor:
        """:meth:`pair_logits` under the scorer's model."""
        return self.pair_logits(self.model, input_ids, attention_mask, step_lengths)

    def action_logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_lengths: Sequence[int], actions: Spans) -> Scores:
        """Each action's mean log-probability under pi_phi minus under pi_ref, scaled, from one pass of each."""
        own, sizes = action_likelihoods(self.model, input_ids, attention_mask, prompt_lengths, actions)
        ref, _ = action_likelihoods(self.reference_model(input_ids.device), input_ids, attention_mask, prompt_lengths, actions)
        return split_rows((self.beta * (own - ref)).cpu().tolist(), sizes)

    def summary(self) -> dict[str, Any]:
        return {"kind": self.kind, "reference": self.reference}


def separating_threshold(positive: Sequence[float], negative: Sequence[float]) -> float:
    """The threshold ``t`` that classifies the most scores right as ``positive`` (> t) or
    ``negative`` (<= t): the midpoint of the best cut between two consecutive distinct scores
    (ties broken towards the cut nearest the middle of the sorted scores); 0 without scores.

    The likelihood kind's zero point: Eq. 4 only sees differences, so the logit's 0 must be
    placed afterwards, here where the training pairs' chosen and rejected steps part best.
    """
    scored = sorted([(float(x), 1) for x in positive] + [(float(x), 0) for x in negative])
    if not scored:
        return 0.0
    # Cut k puts scored[:k] at or below t: right = negatives among them + positives after them.
    n_pos = sum(label for _, label in scored)
    best_k, best_right, neg_below, pos_below = 0, n_pos, 0, 0
    middle = len(scored) / 2
    for k in range(1, len(scored) + 1):
        value, label = scored[k - 1]
        neg_below += 1 - label
        pos_below += label
        if k < len(scored) and scored[k][0] == value:
            continue  # equal scores cannot be cut apart
        right = neg_below + (n_pos - pos_below)
        if right > best_right or (right == best_right and abs(k - middle) < abs(best_k - middle)):
            best_k, best_right = k, right
    if best_k == 0:
        return scored[0][0] - 1.0
    if best_k == len(scored):
        return scored[-1][0] + 1.0
    return (scored[best_k - 1][0] + scored[best_k][0]) / 2


__all__ = [
    "DEFAULT_MAX_LENGTH",
    "PRM_KINDS",
    "reward_model_of_size",
    "SETTINGS_FILE",
    "HeadRewardModel",
    "LikelihoodRatioRewardModel",
    "LikelihoodRewardModel",
    "action_likelihoods",
    "ProcessRewardModel",
    "StepScorer",
    "last_token_rewards",
    "length_batches",
    "likelihood_rewards",
    "span_means",
    "split_rows",
    "step_token_count",
    "token_logprobs",
    "model_folder",
    "pad_batch",
    "reward_model_from_policy",
    "reward_probability",
    "separating_threshold",
    "truncate_left",
]
