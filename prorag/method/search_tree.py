"""The search tree of ProRAG's stage 2 (docs/METHOD.md §2, Eq. 2-3): nodes, PUCT, back-propagation.

A node is a trajectory state; it holds the action that leads to it as the policy wrote it (token
ids, never re-encoded) and what the environment appended, so a state is
``prompt_ids + concat(action_ids + env_ids along the path)``, the exact ids the policy saw.

The rules are small pure functions, checkable by hand: :func:`puct_score` (Eq. 2,
``Q + c_puct * P * sqrt(sum_b N_b) / (1 + N)``); :func:`sibling_priors` (the policy's sequence
probabilities normalised over siblings, or uniform as in the reference code); :func:`updated_q`
(Eq. 3, ``Q <- (Q*N + gamma^(T-t) * v) / (N+1)``: values found far below count less, favouring
short paths). Trees are stored one per JSONL line (:func:`tree_to_dict`) and printed by
:func:`render_tree`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PriorKind = Literal["policy", "uniform"]


@dataclass(eq=False)
class Node:
    """One state of a search tree, reached by the action it holds (the root holds none)."""

    action_ids: list[int] = field(default_factory=list)
    """The action's tokens as the policy wrote them (from ``<step>`` or the token after an
    environment-written ``<step>``, through the closing tag)."""
    env_ids: list[int] = field(default_factory=list)
    """What the environment appended after the action: ``\\n<retrieval>…</retrieval>\\n<step>``
    after a search, ``\\n<step>`` after a conclusion, nothing after a terminal action."""
    action_text: str = ""
    env_text: str = ""
    kind: str | None = None
    """search | conclude | answer, or None for an action without an action tag."""
    content: str = ""
    """The action's sub-query, sub-answer or answer (stripped; best effort when malformed)."""
    well_formed: bool = True
    """I_step of the action."""
    logprob: float = 0.0
    """Sum of the log-probabilities of the action's tokens under the sampling distribution."""
    prior: float = 1.0
    """P(a|s) of Eq. 2, normalised over the siblings."""
    retrieval: dict[str, Any] | None = None
    """A search's ``{"query", "doc_ids"}``."""
    terminal: bool = False
    """The trajectory ends with this action (an answer, end-of-sequence or a cut action)."""
    answer: str | None = None
    stop_reason: str | None = None
    value: float | None = None
    """The node's own evaluation: the terminal value of its answer, or the value of the
    simulation run from it when it was created (T in :attr:`value_end`)."""
    value_end: int = 0
    """The step T at which the evaluated trajectory ended (Eq. 3)."""
    depth: int = 0
    """Actions from the root (the root is 0): the step index t of Eq. 3."""
    visits: int = 0
    """N(s, a)."""
    q: float = 0.0
    """Q(s, a)."""
    children: list[Node] = field(default_factory=list)

    @property
    def expanded(self) -> bool:
        return bool(self.children)


# ----------------------------------------------------------------------------- the rules


def puct_score(q: float, prior: float, parent_visits: int, visits: int, c_puct: float) -> float:
    """Eq. 2: ``Q + c_puct * P * sqrt(sum_b N(s,b)) / (1 + N)``.

    ``parent_visits`` is the sum of the visits of all siblings (the children of the parent),
    as in the equation, not the parent's own count. The exploration bonus shrinks as the
    child is visited and grows with how often its siblings were, at the rate of its prior.
    """
    return q + c_puct * prior * math.sqrt(parent_visits) / (1 + visits)


def select_child(node: Node, c_puct: float) -> Node:
    """The child with the highest :func:`puct_score`; ties go to the earlier child (the
    first sampled), so that selection is deterministic."""
    if not node.children:
        raise ValueError("select_child needs an expanded node")
    total = sum(c.visits for c in node.children)
    scores = [puct_score(c.q, c.prior, total, c.visits, c_puct) for c in node.children]
    return node.children[max(range(len(scores)), key=lambda i: (scores[i], -i))]


def select_path(root: Node, c_puct: float) -> list[Node]:
    """Descend from the root by :func:`select_child` until a node that is not expanded (a
    leaf to expand, a terminal node or a node at the depth limit); return the whole path."""
    path = [root]
    while path[-1].expanded and not path[-1].terminal:
        path.append(select_child(path[-1], c_puct))
    return path


def updated_q(q: float, visits: int, value: float, gamma: float, steps_below: int) -> float:
    """Eq. 3: the running mean ``(Q * N + gamma^(T - t) * v) / (N + 1)``, with
    ``steps_below = T - t`` (how many steps below the node the trajectory ended)."""
    if steps_below < 0:
        raise ValueError(f"a trajectory cannot end above the node (T - t = {steps_below})")
    return (q * visits + gamma**steps_below * value) / (visits + 1)


def backpropagate(path: Sequence[Node], value: float, end: int, gamma: float) -> None:
    """Apply Eq. 3 to every node of ``path`` (root first): the trajectory that gave ``value``
    ended at step ``end`` (``T``); each node ``t`` of the path gets ``gamma^(T - t) * value``
    folded into its Q, and one more visit."""
    for node in path:
        node.q = updated_q(node.q, node.visits, value, gamma, end - node.depth)
        node.visits += 1


def sibling_priors(logprobs: Sequence[float], kind: PriorKind = "policy") -> list[float]:
    """P(a|s) of each sibling: ``softmax`` of the actions' sequence log-probabilities
    (``policy``: the probability the policy gives each sampled action, renormalised over the
    ones sampled), or ``1/n`` each (``uniform``, the reference code)."""
    n = len(logprobs)
    if n == 0:
        return []
    if kind == "uniform":
        return [1.0 / n] * n
    if kind != "policy":
        raise ValueError(f"unknown prior {kind!r}; expected 'policy' or 'uniform'")
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]  # shifted by the max: no underflow to 0/0
    total = sum(weights)
    return [w / total for w in weights]


# ----------------------------------------------------------------------------- paths and states


def iter_paths(root: Node) -> Iterator[tuple[tuple[int, ...], list[Node]]]:
    """Every node with its address (child indices from the root) and its path, depth first."""
    stack: list[tuple[tuple[int, ...], list[Node]]] = [((), [root])]
    while stack:
        address, path = stack.pop()
        yield address, path
        for i in reversed(range(len(path[-1].children))):
            stack.append(((*address, i), [*path, path[-1].children[i]]))


def state_ids(prompt_ids: Sequence[int], path: Sequence[Node]) -> tuple[list[int], list[int]]:
    """The token ids of the state at the end of ``path`` (root first) and their env mask
    (over the ids after the prompt: 1 on action tokens, 0 on the environment's)."""
    ids = list(prompt_ids)
    mask: list[int] = []
    for node in path:
        ids += node.action_ids + node.env_ids
        mask += [1] * len(node.action_ids) + [0] * len(node.env_ids)
    return ids, mask


def format_address(address: Sequence[int]) -> str:
    """``"0.2.1"`` for the third child of the first child's second child; ``"root"`` for ()."""
    return ".".join(map(str, address)) if address else "root"


# ----------------------------------------------------------------------------- trees and JSON


@dataclass(eq=False)
class SearchTree:
    """One question's search tree: the record (with its gold answers and metadata), the
    prompt ids every state starts with, and the root."""

    record: dict[str, Any]
    prompt_ids: list[int]
    root: Node = field(default_factory=Node)
    simulations: int = 0
    """Selection rounds run."""

    @property
    def id(self) -> str:
        return str(self.record["id"])

    @property
    def question(self) -> str:
        return str(self.record["question"])


_NODE_FIELDS = (
    "action_ids", "env_ids", "action_text", "env_text", "kind", "content", "well_formed", "logprob", "prior",
    "retrieval", "terminal", "answer", "stop_reason", "value", "value_end", "depth", "visits", "q",
)  # fmt: skip


def node_to_dict(node: Node) -> dict[str, Any]:
    """A node and its subtree as plain JSON values (children nested)."""
    out = {name: getattr(node, name) for name in _NODE_FIELDS}
    out["children"] = [node_to_dict(c) for c in node.children]
    return out


def node_from_dict(d: dict[str, Any]) -> Node:
    node = Node(**{name: d[name] for name in _NODE_FIELDS if name in d})
    node.children = [node_from_dict(c) for c in d.get("children", [])]
    return node


def tree_to_dict(tree: SearchTree) -> dict[str, Any]:
    """One JSONL line of ``trees.jsonl``."""
    return {
        "id": tree.id,
        "question": tree.question,
        "record": tree.record,
        "prompt_ids": tree.prompt_ids,
        "simulations": tree.simulations,
        "root": node_to_dict(tree.root),
    }


def tree_from_dict(d: dict[str, Any]) -> SearchTree:
    return SearchTree(
        record=d["record"], prompt_ids=list(d["prompt_ids"]), root=node_from_dict(d["root"]), simulations=d["simulations"]
    )


# ----------------------------------------------------------------------------- printing


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_node(node: Node, width: int = 100) -> str:
    """One line: kind, N, Q, prior, own value, and the action (its retrieved doc ids after a search)."""
    kind = node.kind or "?"
    flags = ("" if node.well_formed else " malformed") + (" terminal" if node.terminal else "")
    value = f" v={node.value:.2f}" if node.value is not None else ""
    docs = f"  -> {', '.join(node.retrieval['doc_ids'])}" if node.retrieval and node.retrieval.get("doc_ids") else ""
    return f"[{kind}{flags}] N={node.visits} Q={node.q:.3f} P={node.prior:.2f}{value} {_short(node.action_text, width)!r}{docs}"


def render_tree(tree: SearchTree, *, max_depth: int | None = None, min_visits: int = 0, width: int = 100) -> str:
    """The tree as indented text, children in sampling order, e.g.::

        w004-q0002: When was Bivuk born?  (gold: 1901; 8 simulations)
        root N=8 Q=0.612
        ├─ [search] N=6 Q=0.70 P=0.81 v=1.00 ' I need … </subquery>'  -> w004/bivuk
        │  └─ [conclude] …
        └─ [answer terminal] N=2 Q=0.00 P=0.19 v=0.00 ' … <answer> 1950 </answer>'

    ``max_depth`` stops below that depth; children with fewer than ``min_visits`` visits are
    left out (their number is shown).
    """
    golds = "; ".join(tree.record.get("golden_answers", []))
    lines = [
        f"{tree.id}: {tree.question}  (gold: {golds}; {tree.simulations} simulations)",
        f"root N={tree.root.visits} Q={tree.root.q:.3f}",
    ]

    def walk(node: Node, indent: str) -> None:
        shown = [c for c in node.children if c.visits >= min_visits]
        if max_depth is not None and node.depth >= max_depth:
            if shown:
                lines.append(f"{indent}└─ … {len(shown)} children below depth {max_depth}")
            return
        for i, child in enumerate(shown):
            last = i == len(shown) - 1
            lines.append(f"{indent}{'└─' if last else '├─'} {describe_node(child, width)}")
            walk(child, indent + ("   " if last else "│  "))
        hidden = len(node.children) - len(shown)
        if hidden:
            lines.append(f"{indent}   ({hidden} children with fewer than {min_visits} visits)")

    walk(tree.root, "")
    return "\n".join(lines)


__all__ = [
    "Node",
    "PriorKind",
    "SearchTree",
    "backpropagate",
    "describe_node",
    "format_address",
    "iter_paths",
    "node_from_dict",
    "node_to_dict",
    "puct_score",
    "render_tree",
    "select_child",
    "select_path",
    "sibling_priors",
    "state_ids",
    "tree_from_dict",
    "tree_to_dict",
    "updated_q",
]
