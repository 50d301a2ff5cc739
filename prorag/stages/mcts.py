"""Stage 2 of ProRAG, part 1: Monte Carlo tree search over reasoning actions (docs/METHOD.md §2, Eq. 2-3).

One tree per question (rules in :mod:`prorag.method.search_tree`). A round: select by PUCT to an
unexpanded node; expand with ``K`` sampled actions (temperature 0.9, top-p 0.95, duplicates removed,
searches executed at once), priors from the policy's own probabilities (or uniform); complete every
new non-terminal child greedily and value it by its answer (binary or F1); back-propagate with
``gamma^(T - t)``. A terminal or depth-limited leaf re-propagates its stored value (greedy would
give the same), so visits concentrate on good branches; every new child is evaluated at once so
siblings have Q and N from the start.

Trees run in lock-step batches: one engine call expands every tree's leaf, one greedy call
simulates every new child, all on token ids (never re-encoded); ``benchmarks/mcts.py`` measures it.
Writes ``config.json`` (a rerun with other settings is refused) and ``trees.jsonl`` (appended;
finished questions are skipped on rerun).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prorag.agent.context_budget import drop_over_long
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.sampling import SampleStreams, check_sample_streams, stream_seed
from prorag.agent.schema import parse_token_actions
from prorag.agent.trajectory import Trajectory
from prorag.core.config import setting
from prorag.core.lazy_modules import lazy_module
from prorag.core.metrics import exact_match, f1_score
from prorag.core.setting_checks import check_temperature
from prorag.data.jsonl import JsonlAppender, read_json, read_jsonl, write_json
from prorag.data.records import Record, read_records
from prorag.method.search_tree import (
    Node,
    PriorKind,
    SearchTree,
    backpropagate,
    select_path,
    sibling_priors,
    state_ids,
    tree_from_dict,
    tree_to_dict,
)
from prorag.retrieval.base import Retriever

if TYPE_CHECKING:
    from tqdm import auto as tqdm_auto
else:
    tqdm_auto = lazy_module("tqdm.auto")  # 50 ms (asyncio): imported when a bar starts

log = logging.getLogger(__name__)

TerminalValue = Literal["binary", "f1"]


@dataclass
class MCTSConfig:
    """Settings of the tree search (defaults: the paper's, METHOD.md section 2)."""

    simulations: int = setting(200, help="Selection rounds per tree.")
    num_candidates: int = setting(5, help="K: actions sampled per expansion (before duplicates are removed).")
    max_depth: int = setting(10, help="Nodes at this depth (actions from the root) are not expanded.")
    c_puct: float = setting(2.5, help="Exploration weight of Eq. 2.")
    gamma: float = setting(0.99, help="Discount of Eq. 3 per step between a node and the end of the evaluated trajectory.")
    simulation: Literal["greedy", "sample"] = setting(
        "greedy",
        help="How simulations complete a trajectory: greedily (the reference code) or by sampling at the expansion temperature.",
    )
    terminal_value: TerminalValue = setting(
        "binary",
        help="`binary`: exact match of the final answer with a gold alias (the paper, v in {0,1}); `f1`: its token"
        " F1 (the reference code).",
    )
    prior: PriorKind = setting(
        "policy",
        help="`policy`: P(a|s) from the sampled actions' log-probabilities normalised over the siblings (the "
        "paper); `uniform`: 1/K (the reference code).",
    )
    trees_per_batch: int = setting(32, help="Trees searched in lock-step (their expansions and simulations share engine calls).")
    rollout: RolloutConfig = setting(
        factory=lambda: RolloutConfig(max_actions=13, temperature=0.9, top_p=0.95, batch_size=160),
        help="The engine's settings: expansion sampling (the reference code's temperature 0.9, top-p 0.95), the "
        "actions of a whole trajectory (a simulation from depth d gets `max_actions - d`), `top_k` and the "
        "rows per forward batch (`trees_per_batch * num_candidates` puts a round's expansions in one). Its "
        "`seed` and `greedy` are not used: `seed` and `simulation` are.",
    )
    seed: int = setting(0, help="Seeds the expansions and the simulations.")
    sample_streams: SampleStreams = setting(
        "row",
        help="`row`: each sampled row draws from its own stream, seeded by (seed, question id, round, candidate), so "
        "a tree depends on its question, the policy, the seed and the kind of device only, not on `trees_per_batch`, "
        "`rollout.resume_early`, CUDA graphs or the process count; `batch`: one generator per engine call, seeded by "
        "(seed, batch, round), as runs made before this setting (their trees change with those).",
    )

    def __post_init__(self) -> None:
        for name in ("simulations", "num_candidates", "max_depth", "trees_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"MCTSConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"MCTSConfig.gamma must be in (0, 1], got {self.gamma}")
        if self.c_puct < 0:
            raise ValueError(f"MCTSConfig.c_puct must be >= 0, got {self.c_puct}")
        check_temperature(
            self.rollout.temperature,
            "MCTSConfig.rollout.temperature",
            needs_sampling="an expansion samples K actions, which greedy decoding makes one",
        )
        check_sample_streams(self.sample_streams, "MCTSConfig")
        if self.max_depth > self.rollout.max_actions:
            raise ValueError(
                f"MCTSConfig.max_depth ({self.max_depth}) cannot exceed rollout.max_actions ({self.rollout.max_actions})"
            )


# ----------------------------------------------------------------------------- pure pieces


def terminal_value(answer: str | None, golds: Sequence[str], kind: TerminalValue = "binary") -> float:
    """v of a finished trajectory: exact match (``binary``) or F1 (``f1``) of its answer
    against the gold aliases; 0 without an answer."""
    if answer is None:
        return 0.0
    if kind == "binary":
        return exact_match(answer, golds)
    if kind == "f1":
        return f1_score(answer, golds)
    raise ValueError(f"unknown terminal value {kind!r}; expected 'binary' or 'f1'")


def count_actions(env_mask: Sequence[int]) -> int:
    """Actions in a completion: the runs of model-written tokens (each engine turn writes one
    action, and the environment's tokens separate them)."""
    return sum(1 for i, m in enumerate(env_mask) if m and (i == 0 or not env_mask[i - 1]))


def unique_by_text(nodes: Sequence[Node]) -> list[Node]:
    """Drop duplicate actions (same text up to whitespace), keeping the first sampled."""
    seen: set[str] = set()
    out = []
    for node in nodes:
        key = " ".join(node.action_text.split())
        if key not in seen:
            seen.add(key)
            out.append(node)
    return out


# ----------------------------------------------------------------------------- the search


class TreeSearch:
    """Batched MCTS over questions with a policy and a retriever (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, retriever: Retriever, config: MCTSConfig | None = None) -> None:
        cfg = self.config = config or MCTSConfig()
        self.tokenizer = tokenizer
        sampling = replace(cfg.rollout, seed=cfg.seed, greedy=False)
        from prorag.agent.rollout import RolloutEngine  # the engine imports torch: not at import (--help)

        self.expander = RolloutEngine(model, tokenizer, retriever, replace(sampling, max_actions=1))
        # One generation engine for both, where it is not the in-process model's (vLLM's holds the weights once).
        shared = None if self.expander.steps_tokens else self.expander.backend
        self.simulator = RolloutEngine(
            model, tokenizer, retriever, replace(sampling, greedy=cfg.simulation == "greedy"), backend=shared
        )

    def new_tree(self, record: Record) -> SearchTree:
        return SearchTree(record=record.to_dict(), prompt_ids=self.expander.prompt_ids(record.question))

    def run(
        self,
        records: Sequence[Record],
        *,
        on_tree: Callable[[SearchTree], None] | None = None,
        progress: bool = False,
    ) -> list[SearchTree]:
        """Search a tree for every record, ``trees_per_batch`` at a time in lock-step; trees are
        handed to ``on_tree`` as each batch finishes, and returned in input order."""
        cfg = self.config
        out: list[SearchTree] = []
        bar = tqdm_auto.tqdm(total=len(records) * cfg.simulations, desc="mcts", unit="sim", disable=not progress, smoothing=0.1)
        try:
            for start in range(0, len(records), cfg.trees_per_batch):
                batch = list(records[start : start + cfg.trees_per_batch])
                trees = [self.new_tree(r) for r in batch]
                for rnd in range(cfg.simulations):
                    # One seed per (batch, round), used by `sample_streams: batch` (row streams name their rows).
                    self.simulate(trees, batch, seed=cfg.seed + 1_000_003 * start + 2 * rnd)
                    bar.update(len(trees))
                for tree in trees:
                    if on_tree is not None:
                        on_tree(tree)
                out.extend(trees)
        finally:
            bar.close()
        return out

    def simulate(self, trees: Sequence[SearchTree], records: Sequence[Record], *, seed: int) -> None:
        """One round of every tree: select, expand (one engine call), simulate (one engine
        call), back-propagate."""
        cfg = self.config
        expand: list[tuple[int, list[Node]]] = []
        for t, tree in enumerate(trees):
            path = select_path(tree.root, cfg.c_puct)
            leaf = path[-1]
            tree.simulations += 1
            if leaf.terminal or leaf.depth >= cfg.max_depth:
                # Not expandable: its own (deterministic) evaluation counts again.
                backpropagate(path, leaf.value or 0.0, max(leaf.value_end, leaf.depth), cfg.gamma)
            else:
                expand.append((t, path))
        if not expand:
            return
        rows = [(t, path) for t, path in expand for _ in range(cfg.num_candidates)]
        # With row streams candidate j of a tree's round r is named (question, r, j): a tree's search
        # then does not depend on the trees beside it.
        row_seeds = None
        if cfg.sample_streams == "row":
            row_seeds = [
                stream_seed("prorag-mcts", cfg.seed, records[t].id, trees[t].simulations, j)
                for t, _ in expand
                for j in range(cfg.num_candidates)
            ]
        samples = self.expander.rollout(
            [records[t] for t, _ in rows],
            prompt_ids=[state_ids(trees[t].prompt_ids, path)[0] for t, path in rows],
            close_turn=True,
            seed=seed,
            row_seeds=row_seeds,
        )
        fresh: list[tuple[int, list[Node], Node]] = []
        for j, (t, path) in enumerate(expand):
            leaf = path[-1]
            drawn = samples[j * cfg.num_candidates : (j + 1) * cfg.num_candidates]
            children = unique_by_text([self._child(traj, leaf, records[t]) for traj in drawn])
            for child, prior in zip(children, sibling_priors([c.logprob for c in children], cfg.prior), strict=True):
                child.prior = prior
            leaf.children = children
            fresh.extend((t, path, c) for c in children)
        self._evaluate([(t, path, c) for t, path, c in fresh if not c.terminal], trees, records, seed + 1)
        for _, path, child in fresh:
            backpropagate([*path, child], child.value or 0.0, child.value_end, cfg.gamma)

    def _child(self, traj: Trajectory, parent: Node, record: Record) -> Node:
        """The node of one sampled action: its ids split into the action and the environment's
        reply, parsed (kind, content, I_step) with the parent's ``<step>`` opener in front."""
        mask = traj.env_mask
        n_action = next((i for i, m in enumerate(mask) if not m), len(mask))
        action_ids, env_ids = traj.completion_ids[:n_action], traj.completion_ids[n_action:]
        opener = parent.env_ids[-1:]  # the environment-written <step> (none at the root)
        ids = opener + action_ids
        parsed = parse_token_actions(
            ids, self.expander.tag_ids, [0] * len(opener) + [1] * len(action_ids), blank_ids=self.expander.blank_ids
        )
        action = parsed[0] if parsed else None
        content = ""
        if action is not None and action.content_span is not None:
            a, b = action.content_span
            content = self.tokenizer.decode(ids[a:b], skip_special_tokens=False).strip()
        kind = action.kind.value if action is not None and action.kind is not None else None
        terminal = traj.stop_reason != "max_actions"
        node = Node(
            action_ids=action_ids,
            env_ids=env_ids,
            action_text=self.tokenizer.decode(action_ids, skip_special_tokens=False),
            env_text=self.tokenizer.decode(env_ids, skip_special_tokens=False),
            kind=kind,
            content=content,
            well_formed=bool(action is not None and action.well_formed),
            logprob=float(sum(traj.logprobs[:n_action])),
            retrieval={"query": traj.retrievals[0]["query"], "doc_ids": traj.retrievals[0]["doc_ids"]}
            if traj.retrievals
            else None,
            terminal=terminal,
            answer=traj.answer if kind == "answer" else None,
            stop_reason=traj.stop_reason,
            depth=parent.depth + 1,
        )
        if terminal:
            node.value = terminal_value(node.answer, record.golden_answers, self.config.terminal_value)
            node.value_end = node.depth
        return node

    def _evaluate(
        self, items: list[tuple[int, list[Node], Node]], trees: Sequence[SearchTree], records: Sequence[Record], seed: int
    ) -> None:
        """Simulate from every new non-terminal child at once (one engine call) and store its
        value and the step at which its trajectory ended."""
        if not items:
            return
        cfg = self.config
        row_seeds = None
        if cfg.sample_streams == "row":
            # A sampled simulation (simulation: sample) of the i-th child expanded in a tree's round.
            row_seeds = [
                stream_seed("prorag-mcts-sim", cfg.seed, records[t].id, trees[t].simulations, _child_index(path[-1], child))
                for t, path, child in items
            ]
        sims = self.simulator.rollout(
            [records[t] for t, _, _ in items],
            prompt_ids=[state_ids(trees[t].prompt_ids, [*path, child])[0] for t, path, child in items],
            max_actions=[max(1, cfg.rollout.max_actions - child.depth) for _, _, child in items],
            seed=seed,
            row_seeds=row_seeds,
        )
        for (t, _, child), sim in zip(items, sims, strict=True):
            child.value = terminal_value(sim.answer, records[t].golden_answers, cfg.terminal_value)
            child.value_end = child.depth + count_actions(sim.env_mask)


# ----------------------------------------------------------------------------- the run folder


@dataclass
class MCTSSummary:
    """What a run did (printed by ``prorag mcts``)."""

    trees: int = 0
    already_done: int = 0
    simulations: int = 0
    seconds: float = 0.0
    nodes: int = 0
    solved: int = 0
    """Trees with at least one correct terminal value (a node valued 1 under ``binary``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        rate = self.simulations / self.seconds if self.seconds else 0.0
        return (
            f"searched {self.trees} trees ({self.already_done} already done): {self.simulations} simulations in "
            f"{self.seconds:.1f}s ({rate:.2f} sim/s), {self.nodes} nodes, {self.solved} trees reached a correct answer"
        )


def done_tree_ids(path: Path) -> set[str]:
    """Question ids already in ``trees.jsonl`` (a cut last line is ignored)."""
    return {row["id"] for row in read_jsonl(path, tolerate_truncated_tail=True)} if path.exists() else set()


def read_trees(path: str | Path) -> list[SearchTree]:
    """The trees of a ``trees.jsonl`` file, or of a run folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "trees.jsonl"
    return [tree_from_dict(row) for row in read_jsonl(path, tolerate_truncated_tail=True)]


#: The flat fields of an ``MCTSConfig`` before the engine's settings were nested in ``rollout``.
_FLAT_ROLLOUT_FIELDS = (
    "temperature",
    "top_p",
    "max_actions",
    "max_action_tokens",
    "max_completion_tokens",
    "top_k",
    "batch_size",
    "prompt_style",
)


def nest_legacy_mcts(settings: dict[str, Any]) -> dict[str, Any]:
    """An ``mcts`` block of an older ``config.json`` (engine settings flat) in today's shape, so
    that a run made with the same search resumes; a block already nested is returned as is."""
    if "rollout" in settings or not any(k in settings for k in _FLAT_ROLLOUT_FIELDS):
        return settings
    rest = {k: v for k, v in settings.items() if k not in _FLAT_ROLLOUT_FIELDS}
    moved = {k: settings[k] for k in _FLAT_ROLLOUT_FIELDS if k in settings}
    return {**rest, "rollout": {**asdict(RolloutConfig()), **moved}}


def _check_run_config(run_dir: Path, wanted: dict[str, Any]) -> None:
    """Write ``config.json``, or check that an existing one (of this layout or the older flat
    one) asked for the same search."""
    path = run_dir / "config.json"
    if path.exists():
        have = read_json(path)
        if isinstance(have.get("mcts"), dict):
            have["mcts"] = nest_legacy_mcts(have["mcts"])
        diff = [k for k in ("policy", "mcts") if have.get(k) != wanted.get(k)]
        if diff:
            raise ValueError(f"{path} was written by another search ({', '.join(diff)} differ); use a new --run-dir")
        return
    write_json(path, wanted)


def _child_index(parent: Node, child: Node) -> int:
    """Where ``child`` (the object, not an equal one) sits among ``parent``'s children."""
    return next(i for i, c in enumerate(parent.children) if c is child)


def _count_nodes(node: Node) -> int:
    return 1 + sum(_count_nodes(c) for c in node.children)


def _solved(node: Node) -> bool:
    return (node.value or 0.0) >= 1.0 and node.terminal or any(_solved(c) for c in node.children)


def run_mcts(
    records: Sequence[Record],
    run_dir: str | Path,
    search: TreeSearch,
    *,
    provenance: dict[str, Any] | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> MCTSSummary:
    """Search the records not yet in ``RUN_DIR/trees.jsonl`` and append their trees."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None: every record), got {limit}")
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    _check_run_config(run, {**(provenance or {}), "mcts": asdict(search.config)})
    records = list(records)[:limit] if limit is not None else list(records)
    trees_path = run / "trees.jsonl"
    summary = MCTSSummary()
    with JsonlAppender(trees_path) as out:  # repairs a cut last line before the done ids are read
        done = done_tree_ids(trees_path)
        todo = [r for r in records if r.id not in done]
        todo = drop_over_long(todo, search.expander.model, search.tokenizer, search.expander.config, "MCTS")
        summary.already_done = len(records) - len(todo)
        if summary.already_done:
            log.info("resuming: %d of %d trees already in %s", summary.already_done, len(records), trees_path)

        def write(tree: SearchTree) -> None:
            out.append(tree_to_dict(tree))
            summary.trees += 1
            summary.simulations += tree.simulations
            summary.nodes += _count_nodes(tree.root)
            summary.solved += _solved(tree.root)

        start = time.perf_counter()
        search.run(todo, on_tree=write, progress=progress)
        summary.seconds = time.perf_counter() - start
    return summary


def run_mcts_files(
    policy: str,
    data: str | Path,
    index: str,
    run_dir: str | Path,
    config: MCTSConfig | None = None,
    *,
    limit: int | None = None,
    device: str | None = None,
) -> MCTSSummary:
    """``prorag mcts``: load the policy, the records and the index, and search."""
    from prorag.models.checkpoints import load_sampler
    from prorag.retrieval.index import open_retriever

    records, retriever = read_records(data), open_retriever(index)  # bad input refused before the model loads
    model, tokenizer = load_sampler(policy, (config or MCTSConfig()).rollout, device=device)
    search = TreeSearch(model, tokenizer, retriever, config)
    provenance = {"policy": str(policy), "data": str(data), "index": str(index)}
    return run_mcts(records, run_dir, search, provenance=provenance, limit=limit)


__all__ = [
    "MCTSConfig",
    "MCTSSummary",
    "TerminalValue",
    "TreeSearch",
    "count_actions",
    "done_tree_ids",
    "read_trees",
    "run_mcts",
    "run_mcts_files",
    "terminal_value",
    "unique_by_text",
]
