"""The RL trainer: TRL's ``GRPOTrainer`` (trl==1.16.0) with the engine's rollouts and ProRAG's
``(B, T)`` dual-granularity advantages.

Overridden: ``_generate_and_score_completions`` swaps in the configured estimator's advantages,
gathered across processes (a group's G rows may span them); ``</answer>`` counts as EOS; log-probs
(loss, entropy, ``kl_to_init``) are computed on the policy's tokens only, through TRL's fused LM
head in its compact form on CPU too (with ``num_iterations`` 1 TRL takes ``pi_old`` as the detached
``pi_theta``: no second forward); ``packed_scoring`` packs every one of these forwards without
padding (:mod:`prorag.models.packing`). ``sft_replay`` adds the warm-up's loss on gold trajectories to
every RL loss (InstructGPT's ptx), logged as ``replay_nll``; ``replay_only`` trains on it alone and
generates nothing. Logged beside TRL's metrics: ``clip_fraction``, ``kl_to_init`` (:func:`k3_kl`
against a frozen copy, or the adapter off with LoRA), ``groups_em_agree`` and ``groups_reward_agree``
(groups that gave GRPO nothing to learn from) and what the advantages are made of
(``advantage_abs_mean``, ``advantage_process_share``, ``advantage_silent_share``). With vLLM
generating (``rollout.backend: vllm``, TRL's ``use_vllm``), the mismatch between the sampler and the
trained policy on the policy's tokens: ``sampler_logratio_mean`` and ``sampler_logratio_max`` (the
mean of ``log pi_theta - log pi_vllm`` and the largest ``|log pi_theta - log pi_vllm|``).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import torch
from trl import GRPOTrainer

from prorag.agent.trajectory import Trajectory
from prorag.core.kernels import training_attention
from prorag.method.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    advantage_composition,
    agreeing_group_share,
)
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
)
from prorag.method.rewards.process import prm_judged_actions
from prorag.method.rewards.sources import as_step_source
from prorag.models.packing import pack_layout, packed_label_logprobs, packs_in_one_row
from prorag.stages.rl.config import RLConfig
from prorag.stages.rl.rewards import ScoredBatch, score_batch
from prorag.stages.rl.rollouts import EngineRollout, local_rows
from prorag.stages.sft_replay import SFTReplay, draw_index
from prorag.stages.training import TrainerKernels


def length_sorted_groups(attention: torch.Tensor, rows: int) -> list[tuple[torch.Tensor, int, int]]:
    """The rows of a padded batch (``attention`` ``(B, L)``, 1 on real tokens) in groups of at
    most ``rows``, sorted by the span of their real tokens, each with the columns ``[lo, hi)``
    its rows' real tokens lie in.

    Why: a GRPO batch pads every trajectory to the longest (left-padded prompts, right-padded
    completions), and trajectories of a search agent differ in length by their retrievals, so a
    forward over the whole batch spends much of its arithmetic on padding. Groups of similar
    length, each cut to its own span, do the same per-row arithmetic on fewer positions; the
    columns cut are padding in every row of the group, and a causal model's real tokens never
    read padding, so nothing a real token computes changes (rotary positions are relative)."""
    real = attention.bool()
    width = real.shape[1]
    cols = torch.arange(width, device=real.device)
    first = torch.where(real, cols, width).min(1).values
    last = torch.where(real, cols, -1).max(1).values + 1
    order = torch.argsort((last - first).clamp(min=0), stable=True)
    groups = []
    for start in range(0, len(order), max(1, rows)):
        index = order[start : start + rows]
        lo, hi = int(first[index].min()), int(last[index].max())
        groups.append((index, min(lo, hi), max(lo, hi)))  # rows without a real token: lo = width, hi = 0
    return groups


@contextlib.contextmanager
def compact_fused_head() -> Iterator[None]:
    """TRL's fused LM head, scoring only the positions with a label on CPU too.

    TRL 1.16 projects only the labelled positions through the LM head where its Triton kernel runs;
    elsewhere it projects every position (prompt, padding, retrieved tokens), to keep tile shapes
    fixed for compilers such as Neuron's. Eager CPU recompiles nothing, so there the compact path is
    the same per-row arithmetic on fewer rows (benchmarks/rl_step_profile.py). Other devices keep TRL's choice."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        trl_utils._use_triton = original


class ProcessSupervisedGRPOTrainer(TrainerKernels, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with rollouts from the rollout engine and ProRAG's ``(B, T)``
    dual-granularity advantages (see the module docstring for what is overridden and why).

    ``rl_config`` gives the advantage estimator and its settings (``advantage``, ``beta``,
    ``process_norm``, ``scale_advantages``) and the reward forms; ``scorer`` gives the step rewards:
    a step-reward source (:data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES`) or any object
    with ``score_trajectories`` (e.g. a :class:`~prorag.supervision.reward_model.ProcessRewardModel`),
    ``None`` for the outcome-only baseline.
    """

    def __init__(
        self, *args: Any, rl_config: RLConfig, scorer: Any | None = None, replay: SFTReplay | None = None, **kwargs: Any
    ) -> None:
        if rl_config.uses_prm and scorer is None:
            raise ValueError(
                f"process_reward={rl_config.process_reward!r} needs a step-reward source (or set process_reward='none')"
            )
        self.rl_config = rl_config
        self.scorer = as_step_source(scorer, rl_config.prm_batch_size) if rl_config.uses_prm else None
        self.estimator = ADVANTAGE_ESTIMATORS.get(rl_config.advantage)
        self.outcome_fn = OUTCOME_REWARDS.get(rl_config.outcome_reward.form)(rl_config.outcome_reward)
        self.generation_rows: list[dict[str, Any]] | None = None
        """The dataset rows of the batch being generated (read by :class:`EngineRollout`)."""
        self.replay = replay
        """The SFT replay set (``rl_config.sft_replay``), ``None`` without one."""
        self.replay_draws: tuple[int, int] = (-1, 0)
        """(optimiser step, replay batches drawn in it so far): numbers each micro-batch's draw."""
        self.pending_logs: dict[str, float] = {}
        """Values merged into the next log row (the dev evaluation's ``eval_em``/``eval_f1``)."""
        self.compact_logps = True
        """Score only the tokens the loss reads (:meth:`_get_per_token_logps_and_entropies`); ``False``:
        TRL's path (every completion position through the LM head on CPU), kept for the benchmark."""
        self.score_mask: torch.Tensor | None = None
        """``(B, T)`` completion positions whose log-probabilities are read (the policy's tokens) while
        the loss or ``kl_to_init`` is computed; ``None``: every completion token."""
        model = kwargs.get("model")
        # pi_init as a frozen copy, under full fine-tuning only (with LoRA it is the adapter off): TRL's
        # reference model when beta_kl > 0 (whose log-probs _init_logps reuses), else kept for kl_to_init.
        full = kwargs.get("peft_config") is None and isinstance(model, torch.nn.Module)
        wanted = rl_config.beta_kl > 0 or (rl_config.log_kl_to_init and not rl_config.replay_only)  # no rollouts to score
        frozen = copy.deepcopy(model).eval().requires_grad_(False) if full and wanted else None
        self.init_policy: Any = frozen if rl_config.beta_kl == 0 else None
        """pi_init for ``kl_to_init`` without a KL penalty: a frozen copy (full fine-tuning); ``None`` with LoRA."""
        with trl_reference(frozen if rl_config.beta_kl > 0 else None):
            super().__init__(*args, **kwargs)
        if self.init_policy is not None:  # scored as TRL scores its reference model
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(self.init_policy, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        # A trajectory ending in </answer> has finished: TRL must not count it as truncated.
        from prorag.models.tags import answer_eos_ids

        for eos in answer_eos_ids(self.processing_class):
            if eos not in self.eos_token_ids:
                self.eos_token_ids.append(eos)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.generation_rows = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self.generation_rows = None
            self.score_mask = None  # set by _generate under packed_scoring
        trajectories = [row.get("trajectory") for row in inputs]
        if any(t is None for t in trajectories):
            raise RuntimeError("the rollout function returned no trajectories (TRL merges them into the rows)")
        rollout = self.rollout_func
        records = [rollout.records[int(row["record_index"])] for row in inputs] if isinstance(rollout, EngineRollout) else None
        groups = torch.tensor([int(row["record_index"]) for row in inputs], dtype=torch.long)
        golds = [row["golden_answers"] for row in inputs]
        policy = self.accelerator.unwrap_model(self.model)
        retriever = rollout.retriever if isinstance(rollout, EngineRollout) else None
        scored = score_batch(
            trajectories,
            golds,
            self.processing_class,
            self.rl_config,
            self.scorer,
            records,
            groups.tolist(),
            policy,
            retriever,
            self.outcome_fn,
            self.state.global_step,
        )
        loss_mask = output["completion_mask"]
        if "tool_mask" in output:
            loss_mask = loss_mask * output["tool_mask"]
        output["advantages"] = self._advantages(trajectories, scored, groups, loss_mask)
        self._log_rollout_metrics(scored, groups)
        if getattr(self, "use_vllm", False):
            self._log_sampler_mismatch(output, loss_mask)
        if self.rl_config.log_kl_to_init:
            self._log_kl_to_init(output, loss_mask)
        return output

    @property
    def replay_alone(self) -> bool:
        """A ``replay_only`` training step: no rollouts, the replay term is the whole loss."""
        return self.rl_config.replay_only and self.model.training

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        """TRL's (generate every ``steps_per_generation * num_iterations`` micro-batches, then serve the
        buffer), except that under ``replay_only`` training generates nothing: its loss reads no rollout."""
        if self.replay_alone:
            return {}
        return super()._prepare_inputs(generation_batch)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss, with log-probabilities (and the logged entropy) computed on the policy's tokens only;
        under ``replay_only`` the replay term alone (the policy gradient it stands for is exactly 0)."""
        if self.replay_alone:
            return self._replay_term(model)
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else None
        with self._scoring(mask):
            loss = super()._compute_loss(model, inputs)
        if self.replay is not None and self.model.training:
            loss = loss + self._replay_term(model)
        return loss

    def _replay_term(self, model: Any) -> torch.Tensor:
        """``coef`` x the SFT loss of this micro-batch's replay draw, divided by the gradient
        accumulation as TRL divides its own loss (``coef`` 0: computed without gradients, only
        logged). Logs ``replay_nll``."""
        cfg = self.rl_config.sft_replay
        step, drawn = self.replay_draws
        if step != self.state.global_step:
            step, drawn = self.state.global_step, 0
        self.replay_draws = (step, drawn + 1)
        accumulation = self.current_gradient_accumulation_steps
        draw = draw_index(step, drawn, accumulation, self.accelerator.process_index, self.accelerator.num_processes)
        fused = self.temperature == 1.0  # TRL's fused head divides the logits by the sampling temperature
        rl = self.rl_config
        with torch.set_grad_enabled(cfg.coef > 0), compact_fused_head(), self.accelerator.autocast():
            nll = self.replay.loss(
                model,
                draw,
                fused=fused,
                packed=rl.packed_scoring,
                row_tokens=rl.packed_row_tokens,
                rows=rl.scoring_rows,
                chunk=rl.logprob_chunk,
            )
        self._metrics["train"]["replay_nll"].append(self.accelerator.gather(nll.detach().view(1)).mean().item())
        if cfg.coef == 0:
            return nll.new_zeros(())
        return cfg.coef * nll / accumulation

    @contextlib.contextmanager
    def _scoring(self, mask: torch.Tensor | None) -> Iterator[None]:
        """:attr:`score_mask` set to ``mask`` for the duration (then back to what it was)."""
        before, self.score_mask = self.score_mask, mask
        try:
            yield
        finally:
            self.score_mask = before

    def _generate(self, prompts: list) -> tuple:
        """TRL's generation; under ``packed_scoring`` the rollouts' environment masks then say which
        tokens TRL's own forwards of this batch (pi_old, the reference) score: the policy's only, as
        the loss does (every use of the others is masked). Cleared when the batch is scored."""
        out = super()._generate(prompts)
        tool_mask = out[2]
        if self.rl_config.packed_scoring and tool_mask is not None:
            width = max((len(m) for m in tool_mask), default=0)
            keep = torch.zeros((len(tool_mask), width), dtype=torch.long)
            for i, row in enumerate(tool_mask):
                keep[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
            self.score_mask = keep
        return out

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's per-token log-probabilities and entropies of the completion, only on the tokens that
        are read: labels are ``-100`` off :attr:`score_mask` (retrieved tokens, padding) and the fused
        LM head projects only the labelled positions (:func:`compact_fused_head`); rows run in groups
        of similar length, each cut to its span (``scoring_rows``, :func:`length_sorted_groups`), or
        packed without padding (``packed_scoring``, :meth:`_packed_logps`).
        Equal to TRL's on the scored tokens, 0 elsewhere (where every use of them is masked).
        Text-only models; others, MoE auxiliary losses and ``compact_logps = False`` take TRL's path."""
        if not self.compact_logps or compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **multimodal
            )
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, :-logits_to_keep] = -100
        if self.score_mask is not None:
            keep = fit_columns(self.score_mask.to(labels.device).bool(), logits_to_keep)
            labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(~keep, -100)
        if self.rl_config.packed_scoring:
            return self._packed_logps(model, input_ids, attention_mask, labels, logits_to_keep, batch_size, compute_entropy)
        rows = batch_size or input_ids.size(0)
        if self.rl_config.scoring_rows:
            rows = min(rows, self.rl_config.scoring_rows)
            groups = length_sorted_groups(attention_mask, rows)
        else:
            groups = [
                (torch.arange(s, min(s + rows, len(input_ids)), device=input_ids.device), 0, input_ids.size(1))
                for s in range(0, len(input_ids), rows)
            ]
        width = input_ids.size(1)
        logps, entropies = [], []
        with compact_fused_head(), training_attention(self.cudnn_attention):  # every group is a new (rows, width)
            for index, lo, hi in groups:
                with self.accelerator.autocast():
                    out = model(
                        input_ids=input_ids[index, lo:hi],
                        attention_mask=attention_mask[index, lo:hi],
                        labels=labels[index, lo:hi],
                        fused_lm_head=True,
                    )
                # Column c of the fused head's output scores the label at c + 1: back to (rows, width - 1).
                logps.append(torch.nn.functional.pad(out.log_probs, (lo, width - hi)))
                if compute_entropy:
                    entropies.append(torch.nn.functional.pad(out.entropy, (lo, width - hi)))
        order = torch.argsort(torch.cat([index for index, _, _ in groups]))
        logp = torch.cat(logps).index_select(0, order)[:, -logits_to_keep:]
        entropy = torch.cat(entropies).index_select(0, order)[:, -logits_to_keep:] if compute_entropy else None
        return logp, entropy, None

    def _packed_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """:meth:`_get_per_token_logps_and_entropies` under ``packed_scoring``: the rows' real tokens
        packed (:func:`~prorag.models.packing.pack_layout`, rows of ``packed_row_tokens``, one row for
        flash attention), ``batch_size`` packed rows per forward (at most ``scoring_rows``, each forward
        cut to its fullest row) through the compact fused LM head."""

        def forward(**inputs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            with self.accelerator.autocast():
                out = model(**inputs, fused_lm_head=True)
            return out.log_probs, out.entropy if compute_entropy else None

        cfg = self.rl_config
        layout = pack_layout(attention_mask, cfg.packed_row_tokens, one_row=packs_in_one_row(model))
        rows = min(x for x in (batch_size, cfg.scoring_rows, layout.source.shape[0]) if x)
        with compact_fused_head(), training_attention(self.cudnn_attention):
            logp, entropy = packed_label_logprobs(forward, layout, input_ids, labels, rows=rows)
        return logp[:, -logits_to_keep:], entropy[:, -logits_to_keep:] if compute_entropy else None, None

    def _init_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """pi_init's log-probabilities of the sampled completion tokens (TRL's reference ones when
        ``beta_kl > 0`` already computed them), at the sampling temperature."""
        if "ref_per_token_logps" in output:
            return output["ref_per_token_logps"]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        width = output["completion_ids"].size(1)
        with torch.no_grad():
            if self.init_policy is not None:
                self.init_policy.to(ids.device)
                logps, _, _ = self._get_per_token_logps_and_entropies(self.init_policy, ids, attention, width)
                return logps
            with self.accelerator.unwrap_model(self.model).disable_adapter():
                logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, width)
            return logps

    def _log_kl_to_init(self, output: dict[str, Any], loss_mask: torch.Tensor) -> None:
        """Log ``kl_to_init``, :func:`k3_kl` over this step's policy tokens (all processes)."""
        # pi_theta's log-probs as it sampled: TRL's recomputed ones when it keeps them (num_iterations > 1), else the engine's
        sampled = output.get("old_per_token_logps", output.get("sampling_per_token_logps"))
        if sampled is None:
            return
        with self._scoring(loss_mask):
            init = self._init_logps(output)
        kl = k3_kl(sampled, init)
        mask = loss_mask.to(kl.dtype)
        total = self.accelerator.gather(torch.stack([(kl * mask).sum(), mask.sum()]).double().view(1, 2)).sum(0)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["kl_to_init"].append((total[0] / total[1].clamp(min=1)).item())

    def _log_sampler_mismatch(self, output: dict[str, Any], loss_mask: torch.Tensor) -> None:
        """Log ``sampler_logratio_mean`` and ``sampler_logratio_max`` over every process's policy tokens:
        the per-token log-ratio between the trained policy (TRL's ``old_per_token_logps``, recomputed at
        the sampling temperature) and vLLM's sampled log-probabilities, which TRL's importance-sampling
        correction divides out. Tokens vLLM gave no log-probability for are left out."""
        old, sampled = output.get("old_per_token_logps"), output.get("sampling_per_token_logps")
        if old is None or sampled is None:
            return
        ratio = (old - sampled).float()
        keep = loss_mask.to(ratio.device).bool() & ~torch.isnan(ratio)
        values = ratio[keep]
        largest = values.abs().max() if values.numel() else values.new_zeros(())
        stats = torch.stack([values.sum(), values.new_tensor(float(values.numel())), largest]).double().view(1, 3)
        total = self.accelerator.gather(stats.to(self.accelerator.device))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["sampler_logratio_mean"].append((total[:, 0].sum() / total[:, 1].sum().clamp(min=1)).item())
        self._metrics[mode]["sampler_logratio_max"].append(total[:, 2].max().item())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus ``clip_fraction`` (TRL's ``clip_ratio/region_mean`` under a plain name)
        and whatever :attr:`pending_logs` holds (the dev evaluation)."""
        for metrics in self._metrics.values():
            if "clip_ratio/region_mean" in metrics:
                metrics["clip_fraction"] = list(metrics["clip_ratio/region_mean"])
        logs = {**logs, **self.pending_logs}
        self.pending_logs = {}
        super().log(logs, start_time)

    def _advantages(
        self, trajectories: list[Trajectory], scored: ScoredBatch, groups: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        """The ``(B, T)`` advantages of this process's rows: the configured estimator
        (``rl_config.advantage``) on the whole groups, gathered over all processes (a group's G
        rows may live on different processes; loss masks are padded to the longest), then this
        process's rows and columns."""
        from accelerate.utils import gather_object

        cfg = self.rl_config
        judged = [prm_judged_actions(t.actions, cfg.prm_scope) if cfg.uses_prm else [] for t in trajectories]
        # A NaN step reward (a source's "no process reward here") is no step: its tokens keep A_out.
        judged = [[i for i in keep if math.isfinite(r[i])] for r, keep in zip(scored.step_rewards, judged, strict=True)]
        spans = [[t.actions[i].span for i in keep] for t, keep in zip(trajectories, judged, strict=True)]
        step_rewards = [[r[i] for i in keep] for r, keep in zip(scored.step_rewards, judged, strict=True)]
        kinds = [[t.actions[i].kind for i in keep] for t, keep in zip(trajectories, judged, strict=True)]
        mask = loss_mask.cpu()
        local, width = mask.shape
        if self.accelerator.num_processes > 1:
            outcome_all = gather_object(scored.outcome)
            groups_all = gather_object(groups.tolist())
            steps_all = gather_object(step_rewards)
            spans_all = gather_object(spans)
            kinds_all = gather_object(kinds)
            masks = gather_object(mask.tolist())
            mask_all = torch.zeros(len(masks), max(len(m) for m in masks), dtype=mask.dtype)
            for i, row in enumerate(masks):
                mask_all[i, : len(row)] = torch.tensor(row, dtype=mask.dtype)
        else:
            outcome_all, groups_all, steps_all, spans_all, mask_all = scored.outcome, groups.tolist(), step_rewards, spans, mask
            kinds_all = kinds
        inputs = AdvantageInputs(
            outcome=torch.tensor(outcome_all, dtype=torch.float32),
            group_ids=torch.tensor(groups_all, dtype=torch.long),
            loss_mask=mask_all,
            step_rewards=[torch.tensor(s, dtype=torch.float32) for s in steps_all],
            step_spans=[[tuple(x) for x in row] for row in spans_all],
            beta=cfg.effective_beta,
            process_norm=cfg.process_norm,
            scale=cfg.scale_advantages,
            step_kinds=kinds_all,
        )
        mine = local_rows(self.accelerator.process_index, local)
        advantages = self.estimator(inputs)
        mode = "train" if self.model.training else "eval"
        composition = advantage_composition(
            advantages, inputs.outcome, inputs.group_ids, inputs.loss_mask, scale=cfg.scale_advantages
        )
        for name, value in composition.items():
            self._metrics[mode][name].append(value)
        return advantages[mine, :width].to(loss_mask.device)

    def _log_rollout_metrics(self, scored: ScoredBatch, groups: torch.Tensor) -> None:
        """Per-step means over every process's rows (averaged again over logging steps by TRL), and
        the shares of agreeing groups over whole groups (gathered: a group's rows may sit on
        several processes)."""
        from accelerate.utils import gather_object

        mode = "train" if self.model.training else "eval"
        rows = list(zip(groups.tolist(), scored.em, scored.outcome, strict=True))
        if self.accelerator.num_processes > 1:
            rows = gather_object(rows)
        ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
        for name, column in (("groups_em_agree", 1), ("groups_reward_agree", 2)):
            values = torch.tensor([float(r[column]) for r in rows], dtype=torch.float32)
            self._metrics[mode][name].append(agreeing_group_share(values, ids))
        steps = [r for rs in scored.step_rewards for r in rs if math.isfinite(r)]
        columns = {
            "outcome_reward": scored.outcome,
            "answer_f1": scored.f1,
            "answer_em": scored.em,
            "format_valid_rate": scored.format_valid,
            "searches_per_trajectory": scored.searches,
        }
        device = self.accelerator.device
        sums = {name: (float(sum(values)), float(len(values))) for name, values in columns.items()} | scored.ratios
        for name, (num, den) in sums.items():
            total = self.accelerator.gather(torch.tensor([num, den], dtype=torch.float64, device=device))
            total = total.view(-1, 2).sum(0)
            self._metrics[mode][name].append((total[0] / total[1].clamp(min=1)).item())
        if self.scorer is not None:
            total = self.accelerator.gather(torch.tensor([sum(steps), len(steps)], dtype=torch.float64, device=device))
            total = total.view(-1, 2).sum(0)
            self._metrics[mode]["process_reward"].append((total[0] / total[1].clamp(min=1)).item())
            self._metrics[mode]["time/prm_seconds"].append(scored.prm_seconds)
        rollout = self.rollout_func
        if isinstance(rollout, EngineRollout):
            self._metrics[mode]["time/generation_seconds"].append(rollout.seconds)


@contextlib.contextmanager
def trl_reference(reference: torch.nn.Module | None) -> Iterator[None]:
    """While TRL's trainer is built, its reference model is ``reference`` (a frozen copy of the
    policy as passed in), not a reload of the path the policy's config names: a policy built in
    memory (tests, a stage handing its model on) has no such path, and one whose weights changed
    after loading would silently get another reference. TRL then treats the copy as its own
    (dropout off, fused head, ``accelerator.prepare``). ``None``: TRL's own behaviour."""
    if reference is None:
        yield
        return
    import trl.trainer.grpo_trainer as grpo_module

    loader = grpo_module.create_model_from_path
    grpo_module.create_model_from_path = lambda *args, **kwargs: reference
    try:
        yield
    finally:
        grpo_module.create_model_from_path = loader


def fit_columns(mask: torch.Tensor, width: int) -> torch.Tensor:
    """``mask`` ``(B, w)`` cut or right-padded with ``False`` to ``width`` columns (a completion mask
    against completions TRL padded further, e.g. to a multiple)."""
    if mask.shape[1] >= width:
        return mask[:, :width]
    return torch.nn.functional.pad(mask, (0, width - mask.shape[1]), value=False)


def k3_kl(logps: torch.Tensor, init_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_init) on tokens sampled from ``pi``:
    ``r - 1 - log r`` with ``r = pi_init / pi`` (Schulman's k3: unbiased, never negative, lower
    variance than ``-log r``). ``logps`` are the sampling policy's own log-probabilities."""
    log_ratio = init_logps - logps
    return torch.exp(log_ratio) - 1 - log_ratio


__all__ = [
    "ProcessSupervisedGRPOTrainer",
    "compact_fused_head",
    "fit_columns",
    "k3_kl",
    "length_sorted_groups",
    "trl_reference",
]
