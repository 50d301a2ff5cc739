"""Sampling one token per row: top-p and greedy, per-row random streams and inverse-CDF sampling."""

from __future__ import annotations

import torch

from prorag.agent.sampling import RowStreams, inverse_cdf_sample, sample_next, top_p_filter


def test_row_streams_advance_only_live_rows_and_inverse_cdf_respects_zeros() -> None:
    streams = RowStreams([5, 6], torch.device("cpu"), block=4)
    streams.reserve([0, 1], 3)
    first = streams.draw(torch.tensor([0, 1]), torch.tensor([True, False]))
    second = streams.draw(torch.tensor([0, 1]), torch.tensor([True, True]))
    assert second[1] == first[1] and second[0] != first[0], "a row that was not live draws its uniform again"
    streams.reserve([0], 3)  # row 0 has 2 of its 4 left: it draws its next block, row 1 keeps its own
    expected = torch.rand(8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.cat([first[:1], second[:1], streams.buffer[0, :6]]), expected)
    assert (
        streams.draw(torch.tensor([1]), torch.tensor([True]))[0] == torch.rand(2, generator=torch.Generator().manual_seed(6))[1]
    )
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.2, 0.0, 0.8, 0.0]])
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    tokens = inverse_cdf_sample(probs.repeat(2000, 1), u)
    assert set(tokens[0::2].tolist()) == {1, 3} and set(tokens[1::2].tolist()) == {0, 2}
    assert abs((tokens[1::2] == 2).float().mean().item() - 0.8) < 0.05
    edge = inverse_cdf_sample(probs, torch.tensor([1.0 - 2**-24, 0.0]))  # the largest uniform below 1, and 0
    assert edge.tolist() == [3, 0]


def test_sample_next_top_p_and_greedy() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(sample_next(logits, temperature=1.0, top_p=0.7, greedy=False, generator=g)[0]) for _ in range(200)}
    assert seen == {0, 1}, "top-p 0.7 keeps exactly the two most likely tokens (0.5 + 0.3 >= 0.7)"
    tok, lp = sample_next(logits, temperature=1.0, top_p=1.0, greedy=True, generator=None)
    assert tok.tolist() == [0] and abs(lp.item() - torch.log(torch.tensor(0.5)).item()) < 1e-6
    # Log-probabilities are those of the temperature-scaled distribution.
    _, lp2 = sample_next(logits, temperature=2.0, top_p=1.0, greedy=False, generator=torch.Generator().manual_seed(1))
    assert lp2.item() > torch.log(torch.tensor(0.05)).item()


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: every row sorted in full, the smallest prefix reaching ``top_p`` kept."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    kept = sorted_p.masked_fill((sorted_p.cumsum(-1) - sorted_p) >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, kept)


def test_top_p_filter_by_hand_with_ties_and_equal_to_a_full_sort() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.3, 0.2], [0.25, 0.25, 0.25, 0.25]])
    # Row 0: 0.5 + 0.3 reaches 0.7, tokens 1 and 3 stay. Row 1: 0.3 + 0.25 + 0.25 reaches it, the
    # 0.2 goes. Row 2: three tokens of 0.25 reach it; of the four tied ones, the first three stay.
    expected = torch.tensor([[0.0, 0.5, 0.0, 0.3], [0.25, 0.25, 0.3, 0.0], [0.25, 0.25, 0.25, 0.0]])
    assert torch.equal(top_p_filter(probs, 0.7), expected)
    assert torch.equal(top_p_filter(probs, 1e-9), torch.tensor([[0.0, 0.5, 0, 0], [0, 0, 0.3, 0], [0.25, 0, 0, 0]]))
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([[8.0], [4.0], [1.0], [0.1]]).repeat(10, 1)  # peaked rows to nearly uniform ones
    probs = torch.softmax(torch.randn(40, 500, generator=g) * scale, dim=-1)
    for top_p in (0.5, 0.9, 0.95, 1.0):
        assert torch.equal(top_p_filter(probs, top_p), full_sort_nucleus(probs, top_p)), top_p


def test_stream_seed_names_the_row_and_keeps_rl_streams() -> None:
    """A stream's seed is the 63-bit blake2b of its name: the hand-computed digest, distinct for
    names whose numbers add up alike, and the RL stage's row seeds unchanged by the move here."""
    import hashlib

    from prorag.agent.sampling import stream_seed
    from prorag.stages.rl import row_seed

    by_hand = int.from_bytes(hashlib.blake2b(b"prorag-rft/0/w001-q0002/3", digest_size=8).digest(), "little") >> 1
    assert stream_seed("prorag-rft", 0, "w001-q0002", 3) == by_hand
    assert 0 <= by_hand < 2**63
    assert stream_seed("prorag-mcts", 1, "q", 0) != stream_seed("prorag-mcts", 0, "q", 1)
    assert stream_seed("prorag-rft", 0, "q", 0) != stream_seed("prorag-mcts", 0, "q", 0)
    rl = int.from_bytes(hashlib.blake2b(b"prorag-rl/3/7/11", digest_size=8).digest(), "little") >> 1
    assert row_seed(3, 7, 11) == rl
