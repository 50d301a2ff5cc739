"""The tree search end to end on the tiny world: continuation from token-id states, expansion with
executed searches, greedy simulation, Eq. 3 values, JSONL trees, resume and the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.data.records import Record, read_records
from prorag.method.search_tree import Node, iter_paths, state_ids
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.mcts import MCTSConfig, TreeSearch, count_actions, read_trees, run_mcts, terminal_value, unique_by_text
from tests.agent.test_rollout import _tiny_llama
from tests.fakes import ReplayLM


def engine(**kw: Any) -> RolloutConfig:
    """MCTSConfig's default engine settings with ``kw`` changed."""
    return replace(MCTSConfig().rollout, **kw)


torch.set_num_threads(1)


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:6]


class ForkLM(ReplayLM):
    """Writes the gold trajectories, except that at the first token of every action (right after
    a ``<step>``) it puts almost as much mass on EOS as on the gold token: sampling gives both a
    gold action and an empty one (no answer, value 0), greedy decoding the gold one."""

    def __init__(self, targets: dict[tuple[int, ...], list[int]], vocab_size: int, eos_id: int, step_id: int) -> None:
        super().__init__(targets, vocab_size, eos_id)
        self.step_id = step_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: Any = None, **_: Any) -> Any:
        out = super().forward(input_ids, attention_mask, past_key_values)
        for r, seen in enumerate(out.past_key_values):
            if seen and seen[-1] == self.step_id:
                out.logits[r, -1, self.eos_id] = 29.9
        return out


def _fork_model(world_tokenizer: Any, retriever: BM25Retriever, records: list[Record]) -> ForkLM:
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, retriever)
    targets = {}
    for gold in render_gold(records, retriever, k=3):
        ids, _ = tokenize_segments(world_tokenizer, gold.segments)
        targets[tuple(probe.prompt_ids(gold.question))] = ids
    vocab = world_tokenizer.get_vocab()
    return ForkLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id, vocab["<step>"])


def test_pure_pieces() -> None:
    assert terminal_value("the Krirek", ["Krirek"]) == 1.0
    assert terminal_value("Krirek town", ["Krirek"], "binary") == 0.0
    assert terminal_value("Krirek town", ["Krirek"], "f1") == pytest.approx(2 / 3)
    assert terminal_value(None, ["Krirek"], "f1") == 0.0
    assert count_actions([1, 1, 0, 0, 1, 0, 1, 1]) == 3
    assert count_actions([]) == 0
    a, b, c = Node(action_text=" x  y"), Node(action_text="x y"), Node(action_text="x z")
    assert unique_by_text([a, b, c]) == [a, c]
    with pytest.raises(ValueError, match="max_depth"):
        MCTSConfig(max_depth=14)
    assert (MCTSConfig().simulations, MCTSConfig().num_candidates, MCTSConfig().c_puct, MCTSConfig().gamma) == (200, 5, 2.5, 0.99)


def test_continuing_from_a_state_gives_the_next_action_with_its_retrieval(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """prompt_ids + max_actions + close_turn: one action (and the environment's reply) from a mid-trajectory state,
    token for token what a full rollout writes there."""
    model = _fork_model(world_tokenizer, tiny_retriever, records)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, RolloutConfig(greedy=True, max_action_tokens=64))
    full = engine.rollout(records[:3])
    assert all(t.valid for t in full)
    # The state after the first action and its retrieval, for each record.
    cut = [next(i for i in range(len(t.env_mask) - 1) if t.env_mask[i] == 0 and t.env_mask[i + 1] == 1) + 1 for t in full]
    states = [t.prompt_ids + t.completion_ids[:c] for t, c in zip(full, cut, strict=True)]
    nxt = engine.rollout(records[:3], prompt_ids=states, max_actions=[1, 1, 1], close_turn=True)
    for t, c, n in zip(full, cut, nxt, strict=True):
        assert n.stop_reason == "max_actions"
        end = c + len(n.completion_ids)
        assert n.completion_ids == t.completion_ids[c:end], "the next action and the environment's reply, exactly"
        assert n.env_mask == t.env_mask[c:end] and n.env_mask[-1] == 0, "ends with the environment's <step> opener"
    # Without close_turn the capped action gets no reply (the default behaviour is unchanged).
    bare = engine.rollout(records[:1], prompt_ids=states[:1], max_actions=[1])
    assert all(bare[0].env_mask)
    # Per-row caps: the second row may finish the trajectory.
    both = engine.rollout(records[:2], prompt_ids=states[:2], max_actions=[1, 20])
    assert both[0].stop_reason == "max_actions" and both[1].stop_reason == "answer" and both[1].answer == full[1].answer
    with pytest.raises(ValueError, match="prompt_ids"):
        engine.rollout(records[:2], prompt_ids=states[:1])


def test_search_on_scripted_policy_has_hand_checkable_values(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    model = _fork_model(world_tokenizer, tiny_retriever, records)
    # Eight candidates: each draws the empty action with probability 0.475, so a root without one
    # of the two kinds has probability 0.008 whatever the streams (four gave 0.125).
    cfg = MCTSConfig(
        simulations=3, num_candidates=8, gamma=0.9, trees_per_batch=4, rollout=engine(max_action_tokens=64, batch_size=32)
    )
    trees = TreeSearch(model, world_tokenizer, tiny_retriever, cfg).run(records[:3])
    for tree, record in zip(trees, records[:3], strict=True):
        assert tree.id == record.id and tree.simulations == 3
        kids = tree.root.children
        assert sorted(c.kind is None for c in kids) == [False, True], "one gold action and one empty one (duplicates removed)"
        gold = next(c for c in kids if c.kind is not None)
        empty = next(c for c in kids if c.kind is None)
        assert gold.kind == "search" and gold.well_formed and gold.retrieval and gold.retrieval["doc_ids"]
        assert gold.env_text.startswith("\n<retrieval>") and gold.env_text.endswith("<step>")
        assert empty.terminal and empty.value == 0.0 and not empty.well_formed
        # Greedy simulation from the gold search completes the gold trajectory: v = 1 at T = 2 * hops + 1.
        hops = len(record.metadata["decomposition"])
        assert gold.value == 1.0 and gold.value_end == 2 * hops + 1
        # Its prior (the policy's probability, renormalised) beats the empty action's.
        assert gold.prior > empty.prior and gold.prior + empty.prior == pytest.approx(1.0)
        # Visits: root counts every back-propagated value, children their own.
        assert tree.root.visits == sum(c.visits for c in kids)
        for address, path in iter_paths(tree.root):
            node = path[-1]
            assert node.depth == len(address)
            if node.children:
                ids, mask = state_ids(tree.prompt_ids, path)
                assert len(ids) == len(tree.prompt_ids) + len(mask)
    # Rounds 2 and 3 went below the gold action (the empty one is terminal with Q = 0).
    assert all(max(c.visits for c in t.root.children) >= 2 for t in trees)
    again = TreeSearch(model, world_tokenizer, tiny_retriever, cfg).run(records[:3])
    assert [json.dumps(_shape(t.root)) for t in again] == [json.dumps(_shape(t.root)) for t in trees], "same seed, same trees"


def _shape(node: Node) -> Any:
    return [node.action_text, node.visits, round(node.q, 9), [_shape(c) for c in node.children]]


def test_a_tree_with_row_streams_does_not_depend_on_the_trees_beside_it(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """With ``sample_streams: row`` (the default) a tree searched alone is the tree searched in a
    batch of three, sampled simulations included; with one generator per engine call (``batch``)
    the trees beside it change its draws."""
    model = _tiny_llama(world_tokenizer)

    def shapes(streams: str, trees_per_batch: int) -> list[str]:
        cfg = MCTSConfig(
            simulations=2,
            num_candidates=3,
            simulation="sample",
            max_depth=4,
            trees_per_batch=trees_per_batch,
            sample_streams=streams,
            rollout=engine(max_action_tokens=24, max_actions=4, batch_size=16),
        )
        trees = TreeSearch(model, world_tokenizer, tiny_retriever, cfg).run(records[:3])
        return [json.dumps(_shape(t.root)) for t in trees]

    together = shapes("row", 3)
    assert len(set(together)) == 3 and all(json.loads(t)[3] for t in together), "three expanded trees"
    assert shapes("row", 1) == together
    assert shapes("batch", 1) != shapes("batch", 3)


def test_one_value_per_round_on_a_single_branch(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """Greedy expansion (a deterministic policy): each round adds one node below the last; the
    first child's Q is the mean of the discounted values back-propagated through it."""
    model = ReplayLM(
        _fork_model(world_tokenizer, tiny_retriever, records).targets, len(world_tokenizer), world_tokenizer.eos_token_id
    )
    cfg = MCTSConfig(simulations=2, num_candidates=2, gamma=0.5, trees_per_batch=2, rollout=engine(max_action_tokens=64))
    search = TreeSearch(model, world_tokenizer, tiny_retriever, cfg)
    search.expander.config.greedy = True
    (tree,) = search.run([r for r in records if len(r.metadata["decomposition"]) == 1][:1])
    (first,) = tree.root.children  # two identical samples: one child
    (second,) = first.children
    # T = 3 (search, conclude, answer). Round 1: first gets 0.5^(3-1); round 2: second is created
    # (v = 1, T = 3) and first gets 0.5^(3-1) again.
    assert first.value_end == 3 and second.value_end == 3
    assert first.q == pytest.approx(0.25) and first.visits == 2
    assert second.q == pytest.approx(0.5) and second.visits == 1
    assert tree.root.q == pytest.approx(0.125) and tree.root.visits == 2


def test_run_folder_resumes_and_refuses_other_settings(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    model = _tiny_llama(world_tokenizer)
    cfg = MCTSConfig(
        simulations=2, num_candidates=2, max_depth=3, trees_per_batch=2, rollout=engine(max_actions=4, max_action_tokens=12)
    )
    search = TreeSearch(model, world_tokenizer, tiny_retriever, cfg)
    first = run_mcts(records, tmp_path, search, provenance={"policy": "tiny"}, limit=3, progress=False)
    assert first.trees == 3 and first.simulations == 6
    lines = (tmp_path / "trees.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == [r.id for r in records[:3]]
    # A kill mid-line: the cut line is dropped and its question searched again.
    (tmp_path / "trees.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])
    again = run_mcts(records, tmp_path, search, provenance={"policy": "tiny"}, limit=4, progress=False)
    assert (again.already_done, again.trees) == (2, 2)
    assert [t.id for t in read_trees(tmp_path)] == [r.id for r in records[:4]]
    assert json.loads((tmp_path / "config.json").read_text())["mcts"]["simulations"] == 2
    other = TreeSearch(
        model, world_tokenizer, tiny_retriever, MCTSConfig(simulations=3, max_depth=3, rollout=engine(max_actions=4))
    )
    with pytest.raises(ValueError, match="another search"):
        run_mcts(records, tmp_path, other, provenance={"policy": "tiny"}, progress=False)


def test_run_folder_of_the_flat_layout_resumes_or_is_refused(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """A ``config.json`` written before the engine's settings were nested in ``rollout``: the same
    search resumes, another one is refused with the usual message (not a crash)."""
    from dataclasses import asdict

    cfg = MCTSConfig(
        simulations=1, num_candidates=2, max_depth=3, trees_per_batch=2, rollout=engine(max_actions=4, max_action_tokens=12)
    )
    flat = {k: v for k, v in asdict(cfg).items() if k != "rollout"}
    flat |= {
        k: getattr(cfg.rollout, k)
        for k in (
            "temperature",
            "top_p",
            "max_actions",
            "max_action_tokens",
            "max_completion_tokens",
            "top_k",
            "batch_size",
            "prompt_style",
        )
    }
    (tmp_path / "config.json").write_text(json.dumps({"policy": "tiny", "mcts": flat}))
    search = TreeSearch(_tiny_llama(world_tokenizer), world_tokenizer, tiny_retriever, cfg)
    assert run_mcts(records, tmp_path, search, provenance={"policy": "tiny"}, limit=1, progress=False).trees == 1
    (tmp_path / "config.json").write_text(json.dumps({"policy": "tiny", "mcts": flat | {"temperature": 0.5}}))
    with pytest.raises(ValueError, match=r"config.json was written by another search \(mcts differ\)"):
        run_mcts(records, tmp_path, search, provenance={"policy": "tiny"}, limit=1, progress=False)


@pytest.mark.slow
def test_command_line_searches_shows_and_pairs(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prorag.cli import app
    from prorag.retrieval.index import build_index

    model = _tiny_llama(world_tokenizer)
    monkeypatch.setattr("prorag.models.checkpoints.load_policy", lambda *a, **k: (model, world_tokenizer))
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index")
    (tmp_path / "mcts.yaml").write_text(
        "simulations: 2\nnum_candidates: 3\nmax_depth: 3\nrollout:\n  max_actions: 4\n  max_action_tokens: 12\n"
    )
    runner = CliRunner()
    args = ["mcts", "--policy", "tiny", "--data", str(tiny_world / "test.jsonl"), "--index", str(tmp_path / "index")]
    res = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "run"), "--config", str(tmp_path / "mcts.yaml"), "--limit", "2"])
    assert res.exit_code == 0, res.output
    assert "searched 2 trees" in res.output
    shown = runner.invoke(app, ["mcts-show", str(tmp_path / "run"), "--max-depth", "1"])
    assert shown.exit_code == 0 and "root N=" in shown.output and shown.output.count("simulations)") == 2
    full = runner.invoke(app, ["mcts-show", str(tmp_path / "run")]).output
    assert full.startswith(shown.output.split("\n")[0])
    res = runner.invoke(
        app, ["pairs", "--trees", str(tmp_path / "run"), "--out", str(tmp_path / "pairs.jsonl"), "--min-visits", "1"]
    )
    assert res.exit_code == 0, res.output
    assert "sibling sets" in res.output and (tmp_path / "pairs.jsonl").exists()
    bad = runner.invoke(app, ["mcts", "--run-dir", str(tmp_path / "r2"), "--policy", "tiny"])
    assert bad.exit_code == 2 and "missing --data, --index" in bad.output
