"""The evaluation's settings: :class:`EvalConfig` (which records, which loop or baseline, the
rollout, the generator, the judges, the context budget), apart from the harness so that a config
or ``--help`` can name them without importing torch.

:class:`EvalRolloutConfig` is the rollout engine's settings with greedy decoding by default (the
paper's inference setting); :class:`GeneratorConfig` says what writes text for the generator
baselines (the engine, a local HF model or a served one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prorag.agent.context_budget import OVER_LONG_RULES, OverLongRule
from prorag.agent.rollout_config import RolloutConfig
from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES, Baseline, EvalBaseline
from prorag.evaluation.llm_judge import JudgeConfig
from prorag.method.rewards.hiprag import OverSearchJudgeConfig


@dataclass
class EvalRolloutConfig(RolloutConfig):
    """The rollout engine's settings for an evaluation: :class:`~prorag.agent.rollout_config.RolloutConfig`
    with greedy decoding by default (the paper's inference settings). Every evaluation (``prorag
    eval``, SFT's held-out rollouts) starts from these defaults, also when a YAML ``rollout:``
    block sets only some fields."""

    greedy: bool = setting(True, help="Greedy decoding (the paper's inference setting).")


@dataclass
class GeneratorConfig:
    """What generates text for a generator baseline (``iter-retgen``, ``ircot``, ``flare``, ``search-o1``,
    and ``naive``/``standard-rag`` on a TextGenerator): ``hf``, a local Hugging Face causal LM
    (``prorag.models.generator.HFGenerator``), or ``served``, any OpenAI-compatible server
    (``prorag.models.served.ServedGenerator``: vLLM, SGLang, a hosted API)."""

    kind: Literal["engine", "hf", "served"] = setting(
        "engine",
        help="engine: the rollout engine on --policy (the ProRAG loop, naive, standard-rag); hf: --policy as a "
        "TextGenerator; served: the `served` endpoint.",
    )
    batch_size: int = setting(16, help="hf: prompts per generate() batch.")
    served: dict[str, Any] = setting(
        factory=dict,
        help="served: ServedConfig fields (prorag.models.served), e.g. {base_url: http://127.0.0.1:8000/v1, "
        "model: Qwen/Qwen3-8B, api: completions, api_key_env: null, concurrency: 16}.",
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"generator.batch_size must be >= 1, got {self.batch_size}")
        if self.served:  # its keys and their types now (a typo, a bad timeout), not when the first request goes out
            from prorag.core.config import coerce_fields
            from prorag.models.endpoint_config import ServedConfig

            coerce_fields(ServedConfig, dict(self.served), "generator.served")

    def build(self, policy: str | None = None, *, device: str | None = None) -> Any:
        """The TextGenerator: the served client, or ``policy`` loaded as an HFGenerator."""
        if self.kind == "served":
            if not self.served:
                raise ValueError("generator.kind is served but generator.served is empty (base_url, model, ...)")
            from prorag.core.config import config_from_dict
            from prorag.models.endpoint_config import ServedConfig
            from prorag.models.served import ServedGenerator

            return ServedGenerator(config_from_dict(ServedConfig, dict(self.served), "generator.served"))
        if policy is None:
            raise ValueError(f"generator.kind {self.kind} needs a local model (--policy)")
        from prorag.models.checkpoints import load_policy
        from prorag.models.generator import HFGenerator

        model, tokenizer = load_policy(policy, device=device)
        return HFGenerator(model, tokenizer, batch_size=self.batch_size, device=device)


@dataclass
class EvalConfig:
    """Settings of an evaluation run: which records, which loop, and the rollout settings."""

    limit: int | None = setting(None, help="Evaluate only the first `limit` records.")
    baseline: Baseline | None = setting(
        None,
        help="Evaluate a baseline instead of the ProRAG loop, a name in EVAL_BASELINES (the generator baselines run on "
        "a text generator: evaluate_generator):",
        choices=EVAL_BASELINES,
    )
    baseline_options: dict[str, Any] = setting(
        factory=dict,
        help="Options of a generator baseline (iter-retgen, ircot, flare, search-o1), e.g. {rounds: 5}; "
        "unset keys keep the defaults in each baseline's docstring.",
    )
    rollout: EvalRolloutConfig = setting(
        factory=EvalRolloutConfig,
        help="The engine's settings: documents per retrieval (`top_k`), caps, decoding, batch size, seed, prompt style.",
    )
    generator: GeneratorConfig = setting(
        factory=GeneratorConfig, help="What generates: the rollout engine (default), a local HF TextGenerator or a served model."
    )
    judge: JudgeConfig | None = setting(None, help="LLM judge of acc_l (ACC_L); null: no acc_l.")
    over_search: bool = setting(
        False,
        help="Re-ask each search step's sub-query to the model with no documents (one greedy action per step) for "
        "`over_search_rate`; off: only `under_search_rate` (records with gold decompositions).",
    )
    over_search_judge: OverSearchJudgeConfig = setting(
        factory=OverSearchJudgeConfig,
        help="Who decides a re-asked answer is right (as `rl.outcome_reward.hiprag`): `judge: oracle` (exact match, "
        "default) or `judge: llm` with the endpoint in `llm`.",
    )
    over_long: OverLongRule = setting(
        "skip",
        help="A question whose prompt leaves no room for one action (`rollout.max_action_tokens`) within the policy's "
        "maximum length (its max_position_embeddings, else the tokenizer's model_max_length): `skip` (an empty "
        "prediction scored 0, marked skipped) or `cut` (the question's text cut to fit, keeping its end, marked cut); "
        "counted in metrics.json as over_long_skipped / over_long_cut. The rest of the trajectory is capped by "
        "`rollout.max_completion_tokens`. Applies on the rollout engine (the ProRAG loop, naive, standard-rag).",
    )

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"EvalConfig.limit must be >= 1 (or null: every record), got {self.limit}")
        if self.over_long not in OVER_LONG_RULES:
            raise ValueError(f"EvalConfig.over_long must be one of {OVER_LONG_RULES}, got {self.over_long!r}")
        if self.baseline is not None:
            EVAL_BASELINES.check(self.baseline, "EvalConfig.baseline")
        if self.baseline_options:
            self.baseline_runner()  # unknown or ill-typed options are refused here, with the field named

    def baseline_runner(self) -> EvalBaseline | None:
        """The configured baseline, ``None`` for the ProRAG loop; a baseline with options (an
        ``Options`` dataclass) is built from :attr:`baseline_options`."""
        if self.baseline is None:
            if self.baseline_options:
                raise ValueError("EvalConfig.baseline_options needs a baseline")
            return None
        cls = EVAL_BASELINES.get(self.baseline)
        if getattr(cls, "Options", None) is None:
            if self.baseline_options:
                raise ValueError(f"the {self.baseline} baseline takes no baseline_options, got {sorted(self.baseline_options)}")
            return cls()
        return cls(self.baseline_options)  # type: ignore[call-arg]

    def rollout_config(self) -> RolloutConfig:
        """What the engine runs: :attr:`rollout`, as the baseline adjusts it (one action for a one-shot one)."""
        runner = self.baseline_runner()
        return runner.rollout_config(self.rollout) if runner is not None else self.rollout
