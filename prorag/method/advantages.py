"""Group-relative advantages (GRPO, ProRAG's dual granularity, CPGRPO) as pure tensor functions.

GRPO's baseline is the group of G trajectories of one question. ProRAG (docs/METHOD.md §2, Eq. 7-8)
gives token ``k`` of step ``t`` of trajectory ``i`` the advantage ``A[i,t,k] = A_out[i] + beta * A_proc[i,t]``,
outcome rewards standardised over the G trajectories and step rewards over the steps of all G
(:data:`PROCESS_NORMS`: per step as the paper, per token as the reference code, or per step kind).
CPGRPO is CP-Search's ``|A_out| * pr`` (docs/METHOD.md §5).

Each piece is usable alone (the trainer gathers groups across processes between them);
:data:`ADVANTAGE_ESTIMATORS` is the registry of compositions the RL trainer picks from
(``RLConfig.advantage``). Rows with equal ``group_ids`` form a group wherever they sit; std is the
unbiased one (as TRL and verl); a one-value group gets advantage 0, never NaN; ``scale``
(:data:`ADVANTAGE_SCALES`, :func:`group_normalize`) picks the divisor. Token positions are completion
coordinates, spans ``(start, end)`` end-exclusive; environment tokens and padding get 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prorag.core.lazy_modules import lazy_module
from prorag.core.registry import Registry

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")


ProcessNorm = Literal["step", "token", "step_kind"]

#: What a group's centred values are divided by (:func:`group_normalize`); ``True`` and ``False``
#: are accepted for ``"group"`` and ``"none"``.
AdvantageScale = Literal["group", "batch", "none"]

#: The divisors :func:`group_normalize` knows.
ADVANTAGE_SCALES: tuple[str, ...] = ("group", "batch", "none")

#: The ways :func:`process_advantages` normalises the step rewards.
PROCESS_NORMS: tuple[str, ...] = ("step", "token", "step_kind")

#: Added to the standard deviation before dividing (a group whose rewards all agree gets 0).
DEFAULT_EPS = 1e-6


def scale_name(scale: bool | str) -> str:
    """The name in :data:`ADVANTAGE_SCALES` of a ``scale`` argument: ``True`` is ``"group"``,
    ``False`` is ``"none"`` (the boolean form older configs and TRL's ``scale_rewards`` use)."""
    if scale is True or scale is False:
        return "group" if scale else "none"
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be a bool or one of {ADVANTAGE_SCALES}, got {scale!r}")
    return str(scale)


def group_normalize(
    values: torch.Tensor,
    group_ids: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    scale: bool | AdvantageScale = True,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """Each value minus its group's mean, divided by its group's standard deviation (plus ``eps``).

    ``scale`` picks the divisor (:func:`scale_name`): ``"group"`` (``True``), each group's own std,
    GRPO's choice; ``"none"`` (``False``), nothing, Dr. GRPO's; ``"batch"``, the std of every
    value in the call (the group mean as baseline, the batch std as scale: the normalisation
    Liu et al. 2025 recommend for "LitePPO", and TRL's ``scale_rewards="batch"``).

    Why ``"batch"``: a group's own std gives every group the same push whatever its spread, so a
    group of eight wrong answers that differ only by partial-F1 or format credit (a spread of
    0.1) pushes as hard as one whose answers are right and wrong (0.5). ``"none"`` keeps the groups' proportions but shrinks the
    whole step with the rewards' scale; ``"batch"`` keeps the proportions and divides by one
    number of the rewards' own size, so the update stays near GRPO's size while the questions
    that drive it change.

    ``values``, ``group_ids`` and ``weights`` are ``(N,)``. ``weights`` are frequency weights:
    a value of weight ``w`` counts as ``w`` copies of itself, so the mean is
    ``sum(w v) / sum(w)`` and the variance ``sum(w (v - mean)^2) / (sum(w) - 1)`` -- exactly
    ``torch.mean`` and ``torch.std`` over the values repeated ``w`` times (how the token-level
    normalisation of the reference code sees a step of ``w`` tokens). A group whose total
    weight is at most 1 has standard deviation 0. Returns float32 ``(N,)``.
    """
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(f"values {tuple(values.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D shapes")
    v = values.to(torch.float32)
    w = torch.ones_like(v) if weights is None else weights.to(device=v.device, dtype=torch.float32)
    if w.shape != v.shape:
        raise ValueError(f"weights {tuple(w.shape)} do not match values {tuple(v.shape)}")
    if v.numel() == 0:
        return v
    _, index = torch.unique(group_ids.to(v.device), return_inverse=True)
    n_groups = int(index.max()) + 1
    total = torch.zeros(n_groups, device=v.device).index_add_(0, index, w)
    mean = torch.zeros(n_groups, device=v.device).index_add_(0, index, w * v) / total.clamp(min=torch.finfo(v.dtype).tiny)
    centred = v - mean[index]
    how = scale_name(scale)
    if how == "none":
        return centred
    if how == "batch":
        # One std of every value in the call (frequency-weighted, unbiased as the groups' own), as
        # TRL's scale_rewards="batch"; a batch whose values all agree is all 0.
        n = float(w.sum())
        batch_mean = float((w * v).sum()) / n
        spread = (float((w * (v - batch_mean).square()).sum()) / (n - 1)) ** 0.5 if n > 1 else 0.0
        return centred / (spread + eps) if spread > 0 else torch.zeros_like(centred)
    squares = torch.zeros(n_groups, device=v.device).index_add_(0, index, w * centred.square())
    var = torch.where(total > 1, squares / (total - 1).clamp(min=torch.finfo(v.dtype).tiny), torch.zeros_like(total))
    denom = var.sqrt()[index] + eps
    # A group whose values all agree has nothing to compare: advantage exactly 0 (also with eps = 0).
    # Tested on the values, not on the std: float32 rounding leaves eight copies of 0.2 a std of
    # 1.6e-8, which divided by (std + 1e-6) would be a spurious advantage of -0.015 on every row.
    agree = _agreeing(v, index, n_groups)[index]
    out = torch.where(denom > 0, centred / denom.clamp(min=torch.finfo(v.dtype).tiny), torch.zeros_like(centred))
    return torch.where(agree, torch.zeros_like(out), out)


def _agreeing(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """``(n_groups,)`` booleans: whether every value of the group (rows ``index == g``) is equal."""
    high = torch.full((n_groups,), -torch.inf, device=values.device).scatter_reduce(0, index, values, reduce="amax")
    low = torch.full((n_groups,), torch.inf, device=values.device).scatter_reduce(0, index, values, reduce="amin")
    return high == low


def _group_agreement(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checks and the work the three functions below share: ``(ids, index, agree)``, the
    distinct group ids ascending, each row's position among them and, per group, whether its
    values all agree (``values`` and ``group_ids`` ``(N,)``, on ``values``' device)."""
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(f"values {tuple(values.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D shapes")
    ids, index = torch.unique(group_ids.to(values.device), return_inverse=True)
    return ids, index, _agreeing(values.to(torch.float32), index, ids.numel())


def agreeing_group_share(values: torch.Tensor, group_ids: torch.Tensor) -> float:
    """The share of groups whose values all agree (``values`` and ``group_ids`` ``(N,)``).

    Over outcome rewards it is the share of questions that give GRPO no signal at all (every
    advantage 0); over exact match, the share where all G samples were right or all wrong, the
    quantity that says whether a group size and a policy's accuracy leave anything to learn from.
    0.0 for an empty batch."""
    _, _, agree = _group_agreement(values, group_ids)
    return float(agree.float().mean()) if agree.numel() else 0.0


def agreeing_rows(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``(N,)`` booleans: whether the row's group has values that all agree (``values`` and
    ``group_ids`` ``(N,)``). Over outcome rewards these are the rows of the questions outcome-only
    GRPO is silent on (advantage 0 on every row)."""
    _, index, agree = _group_agreement(values, group_ids)
    return agree[index]


def disagreeing_groups(values: torch.Tensor, group_ids: torch.Tensor) -> list[int]:
    """The ids of the groups whose values do not all agree, ascending (``values`` and
    ``group_ids`` ``(N,)``).

    Over exact match these are the questions with a pass rate strictly between 0 and 1: the
    only ones where outcome-only GRPO has a non-zero advantage (DAPO's dynamic-sampling
    criterion; :func:`agreeing_group_share` is the share of the others)."""
    ids, _, agree = _group_agreement(values, group_ids)
    return [int(g) for g in ids[~agree]]


def grpo_advantages(
    outcome: torch.Tensor, group_ids: torch.Tensor, scale: bool | AdvantageScale = True, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """Plain GRPO: each trajectory's outcome reward standardised within its group, ``(B,)``
    (the same value then goes to every generated token of the trajectory)."""
    return group_normalize(outcome, group_ids, scale=scale, eps=eps)


def advantage_composition(
    advantages: torch.Tensor,
    outcome: torch.Tensor,
    group_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    scale: bool | AdvantageScale = True,
    eps: float = DEFAULT_EPS,
) -> dict[str, float]:
    """What a batch's token advantages are made of, against outcome-only GRPO on the same outcomes.

    ``advantages`` and ``loss_mask`` are ``(B, T)`` (only tokens with mask 1 count), ``outcome``
    and ``group_ids`` ``(B,)``. ``A_out`` is :func:`grpo_advantages` of the outcomes, broadcast to
    each row's tokens; ``D = A - A_out`` is what the estimator adds to it (``beta * A_proc`` for
    ``dual``). Returns, over the policy's tokens:

    - ``advantage_abs_mean``: the mean ``|A|``, the size of the push;
    - ``advantage_process_share``: ``sum |D| / (sum |A_out| + sum |D|)``, how much of the push
      the step rewards contribute (0 for GRPO; 1 where outcomes give nothing);
    - ``advantage_silent_share``: the share of ``sum |A|`` on rows of groups whose outcome rewards
      all agree, the questions GRPO is silent on (exactly 0 for GRPO). A step-reward arm that
      helps only through these shares -- not through which steps it rewards -- is what a shuffled
      control (same distribution, no information) is there to expose.

    All three are 0.0 for a batch without policy tokens.
    """
    if advantages.shape != loss_mask.shape or advantages.dim() != 2:
        raise ValueError(f"advantages {tuple(advantages.shape)} and loss_mask {tuple(loss_mask.shape)} must be equal (B, T)")
    if outcome.shape != (advantages.shape[0],) or group_ids.shape != outcome.shape:
        raise ValueError(
            f"outcome {tuple(outcome.shape)} and group_ids {tuple(group_ids.shape)} must be ({advantages.shape[0]},)"
        )
    mask = loss_mask.to(device=advantages.device, dtype=torch.float32) != 0
    a = torch.where(mask, advantages.to(torch.float32), torch.zeros(()))
    a_out = grpo_advantages(outcome.to(a.device), group_ids.to(a.device), scale=scale, eps=eps)[:, None].expand_as(a)
    a_out = torch.where(mask, a_out, torch.zeros(()))
    tokens = int(mask.sum())
    if tokens == 0:
        return {"advantage_abs_mean": 0.0, "advantage_process_share": 0.0, "advantage_silent_share": 0.0}
    total = float(a.abs().sum())
    extra = float((a - a_out).abs().sum())
    silent = float(a[agreeing_rows(outcome.to(a.device), group_ids.to(a.device))].abs().sum())
    pushed = float(a_out.abs().sum()) + extra
    return {
        "advantage_abs_mean": total / tokens,
        "advantage_process_share": extra / pushed if pushed > 0 else 0.0,
        "advantage_silent_share": silent / total if total > 0 else 0.0,
    }


def kind_groups(groups: torch.Tensor, step_kinds: Sequence[Sequence[str | None]]) -> torch.Tensor:
    """``(N,)`` ids of (group, step kind) for the flattened steps of :func:`process_advantages`:
    two steps share an id iff they share a group and a kind (``None``, a malformed action, is
    a kind of its own).

    >>> kind_groups(torch.tensor([0, 0, 1]), [["search", "answer"], ["search"]]).tolist()
    [1, 0, 3]
    """
    flat = [str(k) for row in step_kinds for k in row]
    if len(flat) != groups.numel():
        raise ValueError(f"{len(flat)} step kinds for {groups.numel()} step rewards")
    names = {k: i for i, k in enumerate(sorted(set(flat)))}
    kinds = torch.tensor([names[k] for k in flat], dtype=torch.long, device=groups.device)
    return groups.to(torch.long) * max(1, len(names)) + kinds


def process_advantages(
    step_rewards: Sequence[torch.Tensor],
    group_ids: torch.Tensor,
    step_lengths: Sequence[torch.Tensor] | None = None,
    process_norm: ProcessNorm = "step",
    *,
    scale: bool | AdvantageScale = True,
    eps: float = DEFAULT_EPS,
    step_kinds: Sequence[Sequence[str | None]] | None = None,
) -> list[torch.Tensor]:
    """``A_proc`` of Eq. 7: the step rewards of each trajectory, standardised over all the steps
    of the trajectory's group.

    ``step_rewards[i]`` is ``(S_i,)``, the rewards of the ``S_i`` steps of trajectory ``i``
    (``S_i`` may be 0); ``group_ids`` is ``(B,)``. With ``process_norm="token"`` each step
    weighs its number of generated tokens, ``step_lengths[i]`` (``(S_i,)``), which is then
    required; with ``"step_kind"`` the statistics are those of the steps of the same group and
    kind (``step_kinds[i]``, the kind of each step, then required; :func:`kind_groups`): searches
    against searches, conclusions against conclusions, answers against answers, since Eq. 4 only
    taught the PRM to rank siblings, not a search against an answer at another depth.
    Returns one ``(S_i,)`` float32 tensor per trajectory.
    """
    if process_norm not in PROCESS_NORMS:
        raise ValueError(f"process_norm must be one of {PROCESS_NORMS}, got {process_norm!r}")
    if len(step_rewards) != group_ids.numel():
        raise ValueError(f"{len(step_rewards)} trajectories of step rewards for {group_ids.numel()} group ids")
    counts = [int(r.numel()) for r in step_rewards]
    flat = torch.cat([r.reshape(-1).to(torch.float32) for r in step_rewards]) if step_rewards else torch.zeros(0)
    groups = torch.repeat_interleave(group_ids.to(flat.device), torch.tensor(counts, device=flat.device))
    weights = None
    if process_norm == "token":
        if step_lengths is None:
            raise ValueError("process_norm='token' needs step_lengths (generated tokens per step)")
        if [int(n.numel()) for n in step_lengths] != counts:
            raise ValueError("step_lengths must have one entry per step reward")
        weights = torch.cat([n.reshape(-1).to(torch.float32) for n in step_lengths]).to(flat.device)
    if process_norm == "step_kind":
        if step_kinds is None:
            raise ValueError("process_norm='step_kind' needs step_kinds (the kind of each step)")
        groups = kind_groups(groups, step_kinds)
    normalized = group_normalize(flat, groups, weights, scale=scale, eps=eps)
    return list(normalized.split(counts))


def sign_bounded(a_out: torch.Tensor, step_values: torch.Tensor) -> torch.Tensor:
    """Step advantages ``step_values`` ``(S,)`` of one trajectory held on the side of its outcome
    advantage ``a_out`` (a 0-d tensor): ``max(v, 0)`` where ``a_out > 0``, ``min(v, 0)`` where
    ``a_out < 0``, 0 where ``a_out == 0``.

    Why: Eq. 8 adds ``beta * A_proc`` to ``A_out``, and in a group with one right answer of eight
    the wrong rows' ``A_out`` is about -0.35, so a step term of ``beta = 0.3`` times one standard
    deviation and a bit reverses it: a step of a wrong trajectory is then pushed up. Bounded, the
    step term can weaken or strengthen the outcome's push on a step, never reverse it, and it
    cannot move a group the outcome is silent on (``A_out = 0`` on every row)."""
    # torch.where, not Python branches: no host sync per row when the advantages live on a GPU.
    held = torch.where(a_out > 0, step_values.clamp(min=0.0), step_values.clamp(max=0.0))
    return torch.where(a_out != 0, held, torch.zeros_like(step_values))


def dual_step_advantages(
    outcome: torch.Tensor,
    step_rewards: Sequence[torch.Tensor],
    group_ids: torch.Tensor,
    beta: float = 0.3,
    process_norm: ProcessNorm = "step",
    step_lengths: Sequence[torch.Tensor] | None = None,
    *,
    scale: bool | AdvantageScale = True,
    eps: float = DEFAULT_EPS,
    step_kinds: Sequence[Sequence[str | None]] | None = None,
    process_rows: torch.Tensor | None = None,
    bound_sign: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Eq. 8 per step: returns ``A_out`` ``(B,)`` and, per trajectory, ``A_out[i] + beta *
    A_proc[i, t]`` for each of its steps ``(S_i,)``.

    These are scalars per trajectory and per step; :func:`broadcast_to_tokens` puts them on the
    tokens. The split lets a distributed trainer compute them on the gathered groups and
    broadcast only its own rows. ``beta = 0`` gives ``A_out`` on every step: plain GRPO.
    ``process_rows`` (``(B,)`` booleans, default all) names the rows that get the process term; the
    others get ``A_out`` on every step. Step rewards are standardised within groups, so leaving out
    whole groups changes nothing in the others. ``bound_sign`` holds each step's value on its
    row's side of 0 (:func:`sign_bounded`).
    """
    a_out = grpo_advantages(outcome, group_ids, scale=scale, eps=eps)
    a_proc = process_advantages(step_rewards, group_ids, step_lengths, process_norm, scale=scale, eps=eps, step_kinds=step_kinds)
    if process_rows is not None and process_rows.shape != a_out.shape:
        raise ValueError(f"process_rows {tuple(process_rows.shape)} must be ({a_out.numel()},)")
    on = [True] * a_out.numel() if process_rows is None else process_rows.tolist()
    per_step = []
    for i, p in enumerate(a_proc):
        values = a_out[i] + beta * p if on[i] else a_out[i].expand(p.numel())
        per_step.append(sign_bounded(a_out[i], values) if bound_sign else values)
    return a_out, per_step


def broadcast_to_tokens(
    row_values: torch.Tensor,
    step_values: Sequence[torch.Tensor],
    step_spans: Sequence[Sequence[tuple[int, int]]],
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """Token-level advantages ``(B, T)``: every token of step ``t`` of row ``i`` (its span over
    the completion, end exclusive) gets ``step_values[i][t]``; generated tokens outside every
    step (none, for the rollout engine's trajectories, whose action spans cover every token the
    model wrote) get the row's own value ``row_values[i]`` (its outcome advantage); and every
    position where ``loss_mask`` is 0 -- retrieval and other environment tokens, padding -- gets
    exactly 0, whatever a span says. Spans past ``T`` are cut at ``T``.
    """
    B, T = loss_mask.shape
    if row_values.shape != (B,) or len(step_values) != B or len(step_spans) != B:
        raise ValueError(f"expected {B} rows of values and spans for a loss mask of shape {(B, T)}")
    out = row_values.to(device=loss_mask.device, dtype=torch.float32)[:, None].expand(B, T).clone()
    for i, (values, spans) in enumerate(zip(step_values, step_spans, strict=True)):
        if len(spans) != values.numel():
            raise ValueError(f"row {i}: {values.numel()} step values for {len(spans)} spans")
        for value, (start, end) in zip(values.tolist(), spans, strict=True):
            out[i, max(0, start) : min(end, T)] = value
    return torch.where(loss_mask != 0, out, torch.zeros_like(out))


def step_token_counts(step_spans: Sequence[Sequence[tuple[int, int]]], loss_mask: torch.Tensor) -> list[torch.Tensor]:
    """Generated tokens (``loss_mask`` 1) inside each step span: the weights of ``process_norm="token"``."""
    return [
        torch.tensor([float(loss_mask[i, max(0, s) : e].sum()) for s, e in spans], dtype=torch.float32)
        for i, spans in enumerate(step_spans)
    ]


def dual_granularity_advantages(
    outcome: torch.Tensor,
    step_rewards: Sequence[torch.Tensor],
    step_spans: Sequence[Sequence[tuple[int, int]]],
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    beta: float = 0.3,
    process_norm: ProcessNorm = "step",
    scale: bool | AdvantageScale = True,
    eps: float = DEFAULT_EPS,
    step_kinds: Sequence[Sequence[str | None]] | None = None,
    process_rows: torch.Tensor | None = None,
    bound_sign: bool = False,
) -> torch.Tensor:
    """ProRAG's token-level advantages ``(B, T)`` (Eq. 7-8), from ``(B,)`` outcome rewards, the
    step rewards ``(S_i,)`` and step spans of each row, the ``(B, T)`` loss mask (1 on tokens the
    model generated, 0 on environment tokens and padding) and the ``(B,)`` group ids.

    ``process_norm="step"`` standardises the step rewards over the group's steps (the paper);
    ``"token"`` over the group's generated tokens (the reference code: a step weighs its token
    count, :func:`step_token_counts`); ``"step_kind"`` over the group's steps of the same kind
    (``step_kinds``). ``beta = 0`` equals :func:`grpo_advantages` broadcast
    to the generated tokens. ``process_rows`` and ``bound_sign`` as in :func:`dual_step_advantages`.
    """
    lengths = step_token_counts(step_spans, loss_mask) if process_norm == "token" else None
    a_out, per_step = dual_step_advantages(
        outcome,
        step_rewards,
        group_ids,
        beta,
        process_norm,
        lengths,
        scale=scale,
        eps=eps,
        step_kinds=step_kinds,
        process_rows=process_rows,
        bound_sign=bound_sign,
    )
    return broadcast_to_tokens(a_out, per_step, step_spans, loss_mask)


def cpgrpo_advantages(advantages: torch.Tensor, process_rewards: torch.Tensor) -> torch.Tensor:
    """CP-Search's CPGRPO advantage ``A' = |A| * pr`` (METHOD.md section 5), elementwise.

    The magnitude comes from the group-relative advantage ``A`` (``(B,)`` or ``(B, T)``), the
    sign from the chain-progressive process reward ``pr`` (``(B, T)``, already broadcast to the
    tokens of each retrieval segment): a token of a segment whose retrieval found gold evidence
    is pushed up, one whose retrieval missed it is pushed down, however the outcome went.
    """
    if advantages.dim() == 1 and process_rewards.dim() == 2:
        advantages = advantages[:, None]
    return advantages.abs() * process_rewards


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class AdvantageInputs:
    """What every advantage estimator is given: one batch of whole groups.

    ``outcome`` ``(B,)`` outcome rewards; ``group_ids`` ``(B,)``; ``loss_mask`` ``(B, T)`` (1 on
    tokens the model generated, 0 on environment tokens and padding); ``step_rewards[i]``
    ``(S_i,)`` and ``step_spans[i]`` (``S_i`` completion spans, end exclusive) the scored steps
    of row ``i``, or ``None`` for no step rewards (outcome only); ``step_kinds[i]`` the kind of
    each of those steps (``search``/``conclude``/``answer``, ``None`` if malformed), needed by
    ``process_norm="step_kind"``. ``beta`` weighs the process term; ``process_norm`` and
    ``scale``/``eps`` are as in :func:`dual_granularity_advantages`.
    """

    outcome: torch.Tensor
    group_ids: torch.Tensor
    loss_mask: torch.Tensor
    step_rewards: Sequence[torch.Tensor] | None = None
    step_spans: Sequence[Sequence[tuple[int, int]]] | None = None
    beta: float = 0.3
    process_norm: ProcessNorm = "step"
    scale: bool | AdvantageScale = True
    eps: float = DEFAULT_EPS
    step_kinds: Sequence[Sequence[str | None]] | None = None

    def steps(self) -> tuple[list[torch.Tensor], list[list[tuple[int, int]]]]:
        """``(step_rewards, step_spans)`` with ``None`` read as no step in any row."""
        if self.step_rewards is None or self.step_spans is None:
            rows = int(self.outcome.numel())
            return [torch.zeros(0) for _ in range(rows)], [[] for _ in range(rows)]
        return list(self.step_rewards), [list(s) for s in self.step_spans]


#: An advantage estimator: the ``(B, T)`` token advantages of one batch of whole groups.
AdvantageEstimator = Callable[[AdvantageInputs], "torch.Tensor"]

#: Advantage estimators by name (``RLConfig.advantage``); a new one is one ``register`` call.
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo", help="outcome only: GRPO's group-standardised outcome reward on every generated token")
def grpo_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """Outcome only: :func:`grpo_advantages` on every generated token (step rewards ignored)."""
    a_out = grpo_advantages(inputs.outcome, inputs.group_ids, scale=inputs.scale, eps=inputs.eps)
    rows = int(a_out.numel())
    return broadcast_to_tokens(a_out, [torch.zeros(0)] * rows, [[]] * rows, inputs.loss_mask)


@ADVANTAGE_ESTIMATORS.register("dual", help="ProRAG's Eq. 7-8, `A_out + beta * A_proc` on each scored step's tokens")
def dual_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """ProRAG's Eq. 7-8, :func:`dual_granularity_advantages`: ``A_out + beta * A_proc`` on the
    tokens of each scored step, ``A_out`` on the other generated tokens. Without step rewards
    (or ``beta = 0``) it equals ``grpo``."""
    return _dual(inputs)


def _dual(inputs: AdvantageInputs, process_rows: torch.Tensor | None = None, bound_sign: bool = False) -> torch.Tensor:
    """:func:`dual_granularity_advantages` of ``inputs``, the step term on ``process_rows`` (default all)."""
    rewards, spans = inputs.steps()
    return dual_granularity_advantages(
        inputs.outcome,
        rewards,
        spans,
        inputs.loss_mask,
        inputs.group_ids,
        inputs.beta,
        inputs.process_norm,
        scale=inputs.scale,
        eps=inputs.eps,
        step_kinds=inputs.step_kinds,
        process_rows=process_rows,
        bound_sign=bound_sign,
    )


@ADVANTAGE_ESTIMATORS.register(
    "cpgrpo", help="CP-Search's `|A_out| * pr` on each scored step's tokens (pair with `process_reward: cpsearch`)"
)
def cpgrpo_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """CP-Search's CPGRPO: ``|A_out| * pr`` on the tokens of each scored step (``pr`` its step
    reward, :func:`cpgrpo_advantages`); generated tokens outside every scored step keep ``A_out``
    itself (no process reward to take a sign from), as ``dual`` leaves them; ``beta`` unused."""
    rewards, spans = inputs.steps()
    a_out = grpo_advantages(inputs.outcome, inputs.group_ids, scale=inputs.scale, eps=inputs.eps)
    signed = [cpgrpo_advantages(a_out[i].expand(r.numel()), r.to(torch.float32)) for i, r in enumerate(rewards)]
    return broadcast_to_tokens(a_out, signed, spans, inputs.loss_mask)


@ADVANTAGE_ESTIMATORS.register(
    "dual_silent", help="`dual` on the groups whose outcome rewards all agree (where GRPO is silent), `grpo` on the others"
)
def dual_silent_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """``dual`` on the groups outcome-only GRPO is silent on (outcome rewards all equal: ``A_out = 0``
    on every row, so the step term is the only push), plain GRPO on the others.

    Why: added to every group, the step term has a cost of its own: with the oracle's verdicts
    shuffled within groups (same distribution, no information) it trained worse than GRPO on
    unscreened questions, by about as much as the oracle's real verdicts gained over that control,
    so the oracle's arm landed on GRPO. Where the outcomes disagree,
    GRPO already says which trajectories to prefer and the step term can only dilute or flip that
    signal on some steps; where they agree (all right, or all wrong: most groups before the policy
    learns) it is the only signal there is. Kept out of the informative groups, the step term
    leaves GRPO's advantages there exactly as they were, so a step reward without information
    costs at most what noise on otherwise silent groups costs. Without step rewards, or ``beta = 0``,
    it equals ``grpo``."""
    return _dual(inputs, process_rows=agreeing_rows(inputs.outcome, inputs.group_ids))


@ADVANTAGE_ESTIMATORS.register(
    "dual_informative", help="its complement: `dual` on the groups whose outcome rewards disagree, `grpo` on the silent ones"
)
def dual_informative_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """The complement of ``dual_silent``: ``dual`` on the groups whose outcome rewards disagree
    (the ones outcome-only GRPO already ranks), plain GRPO (advantage 0) on the silent ones.

    Why: ``dual_silent`` kept the step term off the informative groups and, with it, the oracle's
    worth over its shuffled control. Where the outcomes
    differ, a right trajectory's wrong step and a wrong trajectory's right step are the credit the
    outcome cannot assign; where they all agree, the step term is the only push, so a reward
    without information moves the policy there unchecked. This arm keeps the first and drops the
    second. Without step rewards, or ``beta = 0``, it equals ``grpo``."""
    return _dual(inputs, process_rows=~agreeing_rows(inputs.outcome, inputs.group_ids))


@ADVANTAGE_ESTIMATORS.register(
    "dual_signed",
    help="`dual` with each step's advantage kept on its trajectory's side of 0: the step term never reverses the outcome's sign",
)
def dual_signed_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """``dual`` with each step's advantage held on its trajectory's side of 0 (:func:`sign_bounded`):
    the step term can weaken or strengthen the outcome's push on a step, never reverse it, and
    the groups whose outcome rewards all agree get GRPO's 0.

    Why: on the informative groups alone (``dual_informative``) the oracle's verdicts still beat
    their shuffled control, and the shuffled term still cost EM against GRPO. Beyond adding
    noise, one way a step term without information
    harms there is by reversing the outcome's sign on some steps; this form forbids that. Without
    step rewards, or ``beta = 0``, it equals ``grpo``."""
    return _dual(inputs, bound_sign=True)


@ADVANTAGE_ESTIMATORS.register(
    "zero", help="0 on every token: the control for a term beside the policy gradient, e.g. `sft_replay` alone"
)
def zero_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """Zero on every token: the rollouts teach nothing, whatever their rewards (still computed
    and logged). The control for a term added beside the policy-gradient loss, e.g. SFT replay
    (``rl.sft_replay``): with it, a run is that term alone on the same schedule, so what RL adds
    beyond it can be measured. (Adam normalises each step by the gradient it sees, so the term's
    steps are not smaller for lacking the RL gradient beside them.)"""
    return torch.zeros(inputs.loss_mask.shape, dtype=torch.float32)


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SCALES",
    "AdvantageScale",
    "DEFAULT_EPS",
    "AdvantageEstimator",
    "AdvantageInputs",
    "PROCESS_NORMS",
    "ProcessNorm",
    "advantage_composition",
    "agreeing_rows",
    "broadcast_to_tokens",
    "cpgrpo_advantages",
    "cpgrpo_estimator",
    "dual_informative_estimator",
    "dual_signed_estimator",
    "dual_silent_estimator",
    "dual_estimator",
    "dual_granularity_advantages",
    "dual_step_advantages",
    "group_normalize",
    "grpo_advantages",
    "grpo_estimator",
    "kind_groups",
    "process_advantages",
    "scale_name",
    "zero_estimator",
    "sign_bounded",
    "step_token_counts",
]
