"""The pipeline's config: every stage's typed config in one YAML file (:class:`PipelineConfig`), and the systems it trains.

:func:`resolve` applies the pipeline-wide settings before any stage runs: ``top_k`` to every stage, so
that training, search and evaluation read the same number of documents, and the pipeline's seed to
the stages without their own; :func:`write_resolved_config` writes that copy (``RUN/pipeline_config.yaml``).
Systems on the test split: ``naive``, ``standard-rag`` (trained on the SFT questions), ``sft``
(pi_sft), ``rft`` (pi_rft, "w/o RL"), ``rl-from-sft`` ("w/o refinement"), ``grpo`` (outcome only,
beta 0, from pi_rft) and ``prorag`` (full); RL systems once per seed. ``dpo`` (offline DPO of pi_sft
on the MCTS pairs, ReasonRAG-style) runs only when listed in ``systems``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prorag.core.config import setting
from prorag.core.lazy_modules import lazy_module
from prorag.data.jsonl import atomic_writer
from prorag.data.world.documents import Granularity
from prorag.data.world.generator import check_rl_worlds
from prorag.evaluation.eval_config import EvalConfig
from prorag.stages.dpo_config import DPOConfig
from prorag.stages.mcts import MCTSConfig
from prorag.stages.pairs import PairsConfig
from prorag.stages.prm import PRMConfig
from prorag.stages.rft_config import RFTConfig
from prorag.stages.rl import RLConfig
from prorag.stages.sft_config import SFTConfig
from prorag.stages.sft_data import SFTDataConfig

if TYPE_CHECKING:
    import torch
    import yaml
else:
    yaml = lazy_module("yaml")  # written when the config is saved, not for --help
    torch = lazy_module("torch")


System = Literal["naive", "standard-rag", "sft", "rft", "dpo", "rl-from-sft", "grpo", "prorag"]
#: The systems a config that names none trains (the demo's); ``dpo`` is optional.
DEFAULT_SYSTEMS: tuple[str, ...] = ("naive", "standard-rag", "sft", "rft", "rl-from-sft", "grpo", "prorag")
SYSTEMS: tuple[str, ...] = (*DEFAULT_SYSTEMS, "dpo")
LABELS: dict[str, str] = {
    "naive": "Naive generation (no retrieval)",
    "standard-rag": "Standard RAG (one retrieval)",
    "sft": "SFT policy (stage 1)",
    "rft": "w/o RL (SFT + RFT)",
    "dpo": "Offline DPO (MCTS pairs)",
    "rl-from-sft": "w/o refinement (RL from SFT)",
    "grpo": "GRPO baseline (outcome reward only)",
    "prorag": "ProRAG (full)",
}


RL_SYSTEMS: dict[str, tuple[str, bool]] = {
    # system -> (initial policy, process supervision on)
    "rl-from-sft": ("sft", True),
    "grpo": ("rft", False),
    "prorag": ("rft", True),
}


SplitMode = Literal["worlds", "questions", "pool"]
SPLIT_MODES: tuple[str, ...] = ("worlds", "questions", "pool")
#: The training splits, in the order they are cut (dev and test come from their own files).
TRAIN_SPLITS: tuple[str, ...] = ("sft", "rft", "mcts", "rl")


@dataclass
class DataConfig:
    """Where the questions and the corpus come from, and how the questions are split."""

    world: str | None = setting(
        "demo",
        help="Build the built-in world of this size (`tiny`, `demo`, `large`) into `RUN/world`; `None`: use the files below.",
    )
    world_seed: int = setting(0, help="Seed of the built-in world.")
    passages: Granularity = setting(
        "fact",
        help="Built-in world passages: `fact` (one sentence each) or `page`. Sentences let a tiny model learn to "
        "read within minutes on a CPU (see prorag.data.world.documents).",
    )
    train_file: str | None = setting(None, help="Training records (FlashRAG JSONL) when `world` is None.")
    dev_file: str | None = setting(None, help="Dev records (FlashRAG JSONL) when `world` is None.")
    test_file: str | None = setting(None, help="Test records (FlashRAG JSONL) when `world` is None.")
    corpus_file: str | None = setting(None, help="Corpus JSONL (`{id, contents}`) when `world` is None.")
    split: SplitMode | None = setting(
        None,
        help="How training questions become the stages' splits (see plan_splits): `worlds` (whole training worlds "
        "per stage: SFT+RFT, MCTS/PRM, RL; needs each record's `metadata.partition`), `questions` (the same by "
        "question, for real data), `pool` (the old layout: MCTS, RFT and RL questions are prefixes of one pool). "
        "None: `worlds` with a built-in world, else `questions`.",
    )
    sft_share: float = setting(
        0.6,
        help="Share of the training worlds (`split: worlds`) or questions (`questions`) for SFT and RFT; "
        "`sft_fraction` of their questions train SFT, the rest are RFT's.",
    )
    mcts_share: float = setting(
        0.2, help="Share of the training worlds or questions for MCTS and the PRM; the rest (at least one) are RL's."
    )
    sft_fraction: float = setting(
        0.5,
        help="Share of the SFT worlds' questions used for SFT (and its baselines); RFT samples the rest, which SFT "
        "never sees (`split: pool`: share of all training questions, the rest is the later stages' pool).",
    )
    mcts_questions: int = setting(64, help="MCTS-split questions searched with MCTS (the paper: 728).")
    rft_questions: int | None = setting(None, help="RFT-split questions sampled for RFT (None: all of them).")
    rl_questions: int | None = setting(None, help="RL-split questions of the RL stage (None: all of them).")
    rl_worlds: int = setting(
        0,
        help="Built-in world: RL's questions come from this many extra worlds built for RL alone "
        "(`rl_questions_per_world` each) instead of the RL share of the training worlds, which is then left unused "
        "(so SFT, MCTS and RFT see the same worlds, and pi_rft is the same, as without it). A world's facts recur "
        "across its questions, so RL on a few worlds can learn their facts instead of reading; "
        "0: the RL share of the training worlds.",
    )
    rl_questions_per_world: int = setting(1, help="Questions drawn from each of the `rl_worlds`.")
    dev_questions: int = setting(200, help="Dev questions of SFT's held-out rollouts.")
    test_questions: int | None = setting(None, help="Test questions evaluated (None: all).")

    def __post_init__(self) -> None:
        if not 0.0 < self.sft_fraction < 1.0:
            raise ValueError(f"data.sft_fraction must be in (0, 1), got {self.sft_fraction}")
        if self.split is not None and self.split not in SPLIT_MODES:
            raise ValueError(f"data.split must be one of {SPLIT_MODES} or null, got {self.split!r}")
        if not (0.0 < self.sft_share and 0.0 < self.mcts_share and self.sft_share + self.mcts_share < 1.0):
            raise ValueError(
                f"data.sft_share and data.mcts_share must be > 0 with a sum < 1 (the rest is RL's), "
                f"got {self.sft_share} and {self.mcts_share}"
            )

        check_rl_worlds(self.rl_worlds, self.rl_questions_per_world, prefix="data.")
        if self.rl_worlds and (self.world is None or self.split_mode != "worlds"):
            raise ValueError("data.rl_worlds needs a built-in world (data.world) split by worlds (data.split: worlds)")

    @property
    def split_mode(self) -> SplitMode:
        """:attr:`split`, with None resolved: ``worlds`` for a built-in world, else ``questions``."""
        return self.split or ("worlds" if self.world is not None else "questions")


@dataclass
class IndexConfig:
    """The retrieval index every stage searches."""

    kind: Literal["bm25", "dense"] = setting("bm25", help="`bm25` or `dense` retrieval.")
    model: str | None = setting(
        None, help="Dense: a sentence-transformers model name or path (default: the bundled all-MiniLM-L6-v2)."
    )
    query_prefix: str = setting("", help="Text put before every query (dense models such as E5 want `query: `).")
    passage_prefix: str = setting("", help="Text put before every passage (E5: `passage: `).")
    faiss: str | None = setting(
        None,
        help="Dense: a FAISS index built elsewhere over data.corpus_file (FlashRAG's / Search-R1's e5_Flat.index), "
        "imported instead of encoding the corpus (`prorag index --faiss`); `model` and the prefixes are the ones it was built with.",
    )

    def __post_init__(self) -> None:
        if self.faiss is not None and self.kind != "dense":
            raise ValueError("index.faiss imports a dense index: set index.kind: dense")


@dataclass
class PipelineConfig:
    """Every stage's settings in one file. ``top_k`` (documents per retrieval) is applied to
    every stage so that training, search and evaluation read the same number of documents."""

    data: DataConfig = setting(factory=DataConfig, help="Where the questions and the corpus come from, and how they are split.")
    index: IndexConfig = setting(factory=IndexConfig, help="The retrieval index every stage searches.")
    top_k: int = setting(3, help="Documents per retrieval, applied to every stage.")
    sft_data: SFTDataConfig = setting(factory=SFTDataConfig, help="Stage 1's gold trajectories (`prorag sft-data`).")
    sft: SFTConfig = setting(factory=SFTConfig, help="Stage 1: supervised fine-tuning.")
    mcts: MCTSConfig = setting(factory=MCTSConfig, help="Stage 2: the tree search.")
    pairs: PairsConfig = setting(factory=PairsConfig, help="Stage 2: the judged sibling-step pairs.")
    prm: PRMConfig = setting(factory=PRMConfig, help="Stage 2: the process reward model.")
    dpo: DPOConfig = setting(factory=DPOConfig, help="Baseline `dpo`: offline DPO of pi_sft on the step pairs.")
    rft: RFTConfig = setting(factory=RFTConfig, help="Stage 3: rejection-sampling fine-tuning.")
    rl: RLConfig = setting(factory=RLConfig, help="Stage 4: RL with dual-granularity advantages.")
    eval: EvalConfig = setting(factory=EvalConfig, help="The evaluation of every system.")
    systems: list[str] = setting(
        factory=lambda: list(DEFAULT_SYSTEMS),
        help="Systems to train and evaluate (rows of the results table), in table order; `dpo` only when listed.",
    )
    seeds: list[int] = setting(factory=lambda: [0], help="Seeds of the RL systems (each is trained and evaluated once per seed).")
    process_seeds: list[int] = setting(
        factory=lambda: [0, 1, 2, 3, 4],
        help="Seeds of every arm of `prorag ablate --what process` (same seed, same rollout streams in every arm).",
    )
    extra_arms: dict[str, list[str]] = setting(
        factory=dict,
        help="Arms of `prorag ablate --what process|family` beside the built-in ones: name -> `rl.*` assignments "
        "(`--set` syntax without `rl.`), e.g. `grpo-kl: [beta_kl=0.1]`. A `process_reward` other than `none` "
        "turns on the config's beta and the PRM, as for the built-in arms.",
    )
    arm_controls: dict[str, str] = setting(
        factory=dict,
        help="Arm -> the arm it is tested against beside GRPO (its control: the same run less one thing), added to "
        "the built-in pairs (each PRM arm -> its shuffled control), e.g. `oracle-first-error-kl: grpo-kl`.",
    )
    primary_contrasts: list[str] | None = setting(
        None,
        help="The contrasts of `prorag ablate --what process|family` named primary before the run, 'ARM - OTHER' with "
        "OTHER grpo or the arm's control, e.g. `[prorag - grpo]`: reported with their nominal p-values (Holm among "
        "themselves), every other contrast with its Holm-adjusted p beside the nominal one. None: each arm against "
        "grpo, but the arms that are controls.",
    )
    stream_control: bool = setting(
        False,
        help="`prorag ablate --what process|family`: also run the `frozen` arm (outcome-only GRPO at learning rate 0: "
        "pi_rft sampled on each seed's question stream; no test evaluation) and report every RL arm's training "
        "answer EM against it over the second half of the pass, whether the schedule learns at all "
        "(prorag.experiments.stream_control). One more RL run per seed.",
    )
    seed: int = setting(0, help="Seed of the question splits and of every stage but the RL seeds.")
    device: str | None = setting(
        None,
        help="Device of the policy and the PRM where no trainer places them (MCTS, the PRM audit, RFT's sampling, "
        "the evaluations, the step scores): `cuda`, `cuda:1`, `cpu`, ...; None: `cuda` when torch sees a CUDA "
        "device, else `cpu`. The trainers (SFT, PRM, RFT's fine-tuning, RL) use CUDA whenever it is there.",
    )
    report: bool = setting(True, help="Write `report.md` / `report.html` at the end.")

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown systems {unknown}; expected some of {list(SYSTEMS)}")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.device is not None and not self.device.strip():
            raise ValueError("device must be a torch device name such as `cuda` or `cpu`, or null")


def stage_device(device: str | None) -> str:
    """The device of the stages that place their models themselves (:attr:`PipelineConfig.device`):
    ``device`` as given, or ``cuda`` when torch sees a CUDA device and ``cpu`` otherwise. A device torch
    cannot parse, or ``cuda`` on a machine without one, is refused before any stage runs."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device: {device!r} is not a torch device name (e.g. `cuda`, `cuda:0`, `cpu`)") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r}, but torch sees no CUDA device here (set `device: cpu` or leave it null)")
    return device


def resolve(config: PipelineConfig) -> PipelineConfig:
    """Apply the pipeline-wide settings to the stage configs: ``top_k`` everywhere, and the
    pipeline's seed to the stages that do not have their own."""
    k = config.top_k
    return replace(
        config,
        sft_data=replace(config.sft_data, top_k=k),
        sft=replace(config.sft, top_k=k, seed=config.seed),
        mcts=replace(config.mcts, seed=config.seed, rollout=replace(config.mcts.rollout, top_k=k)),
        prm=replace(config.prm, seed=config.seed),
        dpo=replace(config.dpo, seed=config.seed),
        rft=replace(config.rft, seed=config.seed, rollout=replace(config.rft.rollout, top_k=k)),
        rl=replace(config.rl, rollout=replace(config.rl.rollout, top_k=k)),
        eval=replace(config.eval, rollout=replace(config.eval.rollout, top_k=k)),
    )


def write_resolved_config(config: PipelineConfig, path: Path) -> None:
    """The config every stage ran with, as YAML that :func:`~prorag.core.config.load_config` reads back."""
    with atomic_writer(path) as f:
        f.write(yaml.safe_dump(asdict(config), sort_keys=False))


def non_default_fields(config: Any) -> dict[str, Any]:
    """The fields of a config dataclass that differ from their defaults, nested configs
    included (what a readable YAML file needs to say; :func:`~prorag.core.config.load_config` fills
    in the rest)."""
    out: dict[str, Any] = {}
    default = type(config)()
    for f in dataclasses.fields(config):
        value, base = getattr(config, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(value) and type(value) is type(base):
            nested = non_default_fields(value)
            if nested:
                out[f.name] = nested
        elif value != base:
            out[f.name] = asdict(value) if dataclasses.is_dataclass(value) else value
    return out
