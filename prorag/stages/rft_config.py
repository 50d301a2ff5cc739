"""Stage 3's settings (:class:`RFTConfig`: sampling, the correctness and PRM filters, the fine-tuning),
apart from the stage so that a config or ``--help`` can name them without importing torch or TRL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.sampling import SampleStreams, check_sample_streams
from prorag.core.config import setting
from prorag.method.rewards.process import PRM_SCOPES, PRMScope
from prorag.stages.sft_config import SFTTrainingConfig

Correctness = Literal["em", "f1"]


@dataclass
class RFTConfig:
    """Settings of the RFT stage. The paper fixes the filters (correct answer, PRM logit > 0)
    and the fine-tuning (next-token loss, one epoch); it does not give ``N``."""

    # The paper gives no value; 8 is its RL group size `G`, and it makes a question whose samples are right a quarter of the
    # time yield a correct trajectory with probability 0.9 (`1 - 0.75**8`). Sampling cost grows linearly with it.
    samples_per_question: int = setting(8, help="`N`, trajectories sampled per question.")
    rollout: RolloutConfig = setting(
        factory=RolloutConfig,
        help="The engine's settings: sampling at temperature 1.0 (no top-p), inference caps (13 actions), `top_k` "
        "documents per search, rollout batch size (a chunk of questions fills one batch: `batch_size // N` "
        "questions). Its `seed` is not used: the stage's `seed` is.",
    )
    correctness: Correctness = setting(
        "em", help='Outcome filter: `"em"`, normalised exact match with any gold alias; `"f1"`, token F1 at least f1_threshold.'
    )
    f1_threshold: float = setting(0.8, help='F1 a trajectory needs to count as correct with `correctness="f1"`.')
    prm_threshold: float = setting(
        0.0, help="An action is kept when its PRM logit is strictly above this (0: sigmoid > 0.5, the paper's)."
    )
    drop_malformed_actions: bool = setting(
        True, help="Also drop actions that are not well formed (I_step = 0), whatever their PRM score."
    )
    # See prorag.method.rewards.process.prm_judged_actions for why.
    prm_scope: PRMScope = setting(
        "all",
        help='Which actions the PRM filter judges: `"all"` (the paper: every action, the answer included) or '
        '`"reasoning"` (a well-formed answer of a correct trajectory is kept on the outcome filter alone; the'
        " PRM judges the searches and conclusions).",
    )
    if_nothing_kept: Literal["error", "copy_policy"] = setting(
        "error",
        help="When no (context, action) pair passes the filters (a policy too weak to answer any sampled question "
        'right): `"error"` stops with the counts; `"copy_policy"` logs a warning and writes pi_sft unchanged '
        "as pi_rft (fine-tuning on nothing is a no-op), so a pipeline with small budgets goes on.",
    )
    limit: int | None = setting(None, help="Use only the first `limit` questions of the record file.")
    seed: int = setting(0, help="Seeds the sampling and the fine-tuning (replaces `train.seed`).")
    sample_streams: SampleStreams = setting(
        "row",
        help="`row`: sample k of a question draws from its own stream, seeded by (seed, question id, k), so the samples "
        "do not depend on the batch size, the chunking, `rollout.resume_early`, CUDA graphs or the process count (a "
        "CUDA generator draws other numbers than a CPU one); `batch`: one "
        "generator per chunk, seeded by (seed, chunk), as runs made before this setting (their samples change with those).",
    )
    train: SFTTrainingConfig = setting(
        factory=SFTTrainingConfig,
        help="The fine-tuning: stage 1's trainer settings (one epoch, lr 2e-5, reference loss weights by default);"
        " its `seed` is replaced by seed.",
    )

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"RFTConfig.limit must be >= 1 (or null: every question), got {self.limit}")
        if self.samples_per_question < 1:
            raise ValueError(f"RFTConfig.samples_per_question must be >= 1, got {self.samples_per_question}")
        if self.correctness not in ("em", "f1"):
            raise ValueError(f"RFTConfig.correctness must be 'em' or 'f1', got {self.correctness!r}")
        if not 0.0 < self.f1_threshold <= 1.0:
            raise ValueError(f"RFTConfig.f1_threshold must be in (0, 1], got {self.f1_threshold}")
        if self.prm_scope not in PRM_SCOPES:
            raise ValueError(f"RFTConfig.prm_scope must be one of {PRM_SCOPES}, got {self.prm_scope!r}")
        check_sample_streams(self.sample_streams, "RFTConfig")

    def sampling_settings(self) -> dict[str, Any]:
        """What decides the samples and their verdicts; a resumed run must not change it."""
        keys = (
            "samples_per_question",
            "rollout",
            "correctness",
            "f1_threshold",
            "prm_threshold",
            "drop_malformed_actions",
            "prm_scope",
            "seed",
            "sample_streams",
        )
        return {k: v for k, v in asdict(self).items() if k in keys}
