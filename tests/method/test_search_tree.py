"""The rules of the tree search on hand-built trees, against hand-computed values (Eq. 2, Eq. 3)."""

from __future__ import annotations

import json
import math

import pytest

from prorag.method.search_tree import (
    Node,
    SearchTree,
    backpropagate,
    iter_paths,
    puct_score,
    render_tree,
    select_child,
    select_path,
    sibling_priors,
    state_ids,
    tree_from_dict,
    tree_to_dict,
    updated_q,
)


def _parent(*children: tuple[float, float, int]) -> Node:
    """A node whose children have the given (Q, prior, N)."""
    root = Node()
    root.children = [Node(q=q, prior=p, visits=n, depth=1, action_text=f"a{i}") for i, (q, p, n) in enumerate(children)]
    return root


def test_puct_score_is_eq_2() -> None:
    # Q + c * P * sqrt(sum N) / (1 + N): 0.5 + 2.5 * 0.2 * sqrt(4) / (1 + 3) = 0.75
    assert puct_score(0.5, 0.2, 4, 3, 2.5) == pytest.approx(0.75)
    assert puct_score(0.2, 0.5, 4, 1, 2.5) == pytest.approx(1.45)
    assert puct_score(0.0, 0.3, 4, 0, 2.5) == pytest.approx(1.5)
    assert puct_score(0.7, 0.9, 0, 0, 2.5) == pytest.approx(0.7), "no sibling visits: no exploration bonus"


def test_select_child_takes_the_highest_puct() -> None:
    # sum N = 3 + 1 + 0 = 4, sqrt = 2; scores 0.75, 1.45, 1.5 -> the unvisited third child.
    root = _parent((0.5, 0.2, 3), (0.2, 0.5, 1), (0.0, 0.3, 0))
    assert select_child(root, 2.5) is root.children[2]
    # With prior 0.25 the third scores 1.25 < 1.45: the second.
    root.children[2].prior = 0.25
    assert select_child(root, 2.5) is root.children[1]
    # Without exploration, the highest Q.
    assert select_child(root, 0.0) is root.children[0]
    # Ties go to the earlier child.
    tie = _parent((0.3, 0.5, 1), (0.3, 0.5, 1))
    assert select_child(tie, 2.5) is tie.children[0]


def test_select_path_stops_at_a_leaf_or_a_terminal_node() -> None:
    root = _parent((0.9, 0.5, 2), (0.1, 0.5, 2))
    best = root.children[0]
    best.children = [Node(depth=2, q=0.0, prior=1.0, visits=0)]
    assert select_path(root, 0.0) == [root, best, best.children[0]]
    best.terminal = True
    assert select_path(root, 0.0) == [root, best]


def test_updated_q_and_backpropagation_are_eq_3() -> None:
    # Path root (t=0, N=2, Q=0.5) -> a (t=1, N=1, Q=1.0) -> b (t=2, N=0); v = 1 found at T = 4, gamma 0.9.
    root = Node(depth=0, visits=2, q=0.5)
    a = Node(depth=1, visits=1, q=1.0)
    b = Node(depth=2, visits=0, q=0.0)
    backpropagate([root, a, b], 1.0, end=4, gamma=0.9)
    assert b.q == pytest.approx(0.81)  # (0 * 0 + 0.9^2 * 1) / 1
    assert a.q == pytest.approx((1.0 * 1 + 0.9**3) / 2)  # 0.8645
    assert root.q == pytest.approx((0.5 * 2 + 0.9**4) / 3)  # 0.552033…
    assert (root.visits, a.visits, b.visits) == (3, 2, 1)
    # A zero value lowers the running mean without a discount effect.
    assert updated_q(0.81, 1, 0.0, 0.9, 2) == pytest.approx(0.405)
    assert updated_q(0.0, 0, 1.0, 1.0, 7) == 1.0, "gamma = 1: no discount"
    with pytest.raises(ValueError, match="above the node"):
        updated_q(0.0, 0, 1.0, 0.9, -1)


def test_sibling_priors_normalise_sequence_probabilities() -> None:
    # softmax([-1, -2, -3]) = e^0, e^-1, e^-2 over their sum
    z = 1 + math.exp(-1) + math.exp(-2)
    assert sibling_priors([-1.0, -2.0, -3.0]) == pytest.approx([1 / z, math.exp(-1) / z, math.exp(-2) / z])
    # Very long actions have tiny probabilities; shifting by the max keeps them finite.
    assert sibling_priors([-900.0, -901.0]) == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])
    assert sibling_priors([-1.0, -50.0, -3.0], "uniform") == pytest.approx([1 / 3] * 3)
    assert sibling_priors([]) == []
    with pytest.raises(ValueError, match="unknown prior"):
        sibling_priors([0.0], "flat")  # type: ignore[arg-type]


def _tree() -> SearchTree:
    root = Node(visits=3, q=0.4)
    search = Node(
        action_ids=[1, 2, 3], env_ids=[7, 8], action_text="<step> t </step><subquery> q </subquery>", env_text="\n<retrieval>d</retrieval>\n<step>",
        kind="search", content="q", retrieval={"query": "q", "doc_ids": ["w0/a"]}, depth=1, visits=2, q=0.6, prior=0.7, value=1.0, value_end=3,
    )  # fmt: skip
    wrong = Node(action_ids=[1, 4, 5], action_text="<step> t </step><answer> x </answer>", kind="answer", content="x", answer="x",
                 terminal=True, depth=1, visits=1, q=0.0, prior=0.3, value=0.0, value_end=1)  # fmt: skip
    search.children = [
        Node(action_ids=[9], action_text=" u </step><subanswer> s </subanswer>", kind="conclude", depth=2, visits=1, q=0.9)
    ]
    root.children = [search, wrong]
    return SearchTree(
        record={"id": "q1", "question": "Who?", "golden_answers": ["y"], "metadata": {}},
        prompt_ids=[100, 101],
        root=root,
        simulations=3,
    )


def test_state_ids_join_actions_and_environment_replies() -> None:
    tree = _tree()
    search = tree.root.children[0]
    ids, mask = state_ids(tree.prompt_ids, [tree.root, search, search.children[0]])
    assert ids == [100, 101, 1, 2, 3, 7, 8, 9]
    assert mask == [1, 1, 1, 0, 0, 1]
    addresses = [a for a, _ in iter_paths(tree.root)]
    assert addresses == [(), (0,), (0, 0), (1,)]


def test_trees_round_trip_through_json_and_print() -> None:
    tree = _tree()
    line = json.dumps(tree_to_dict(tree))
    back = tree_from_dict(json.loads(line))
    assert tree_to_dict(back) == tree_to_dict(tree)
    assert back.root.children[0].children[0].q == 0.9
    text = render_tree(tree)
    assert text.splitlines()[0].startswith("q1: Who?")
    assert "├─ [search] N=2 Q=0.600 P=0.70 v=1.00" in text and "-> w0/a" in text
    assert "│  └─ [conclude] N=1 Q=0.900" in text
    assert "└─ [answer terminal] N=1 Q=0.000" in text
    assert "children with fewer than 2 visits" in render_tree(tree, min_visits=2)
    assert "[conclude]" not in render_tree(tree, max_depth=1)
