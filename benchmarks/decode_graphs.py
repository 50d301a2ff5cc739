"""Rollout decode speed on a GPU: the engine with CUDA graphs against HF ``generate`` and itself eager.

    python benchmarks/decode_graphs.py [--shape qwen3-0.6b|tiny] [--batch 64] [--new-tokens 256]
        [--device cuda] [--out results.json]

The model is shaped like Qwen3-0.6B (28 layers, hidden 1024, 16 query and 8 KV heads of 128,
MLP 3072, vocabulary 151,936), bf16, SDPA attention, with random weights: speed depends on the
shapes, not on what the weights know. Its head has a bias that keeps it on the built-in world's
tokenizer (ids past it at -1e4) and leans towards the trajectory tags, so that rollouts have
several actions of a few dozen tokens and real BM25 retrievals between them.

Three sides, same model and questions (``--batch`` of them, one batch):

* **HF generate**: ``model.generate`` on the same prompts (left-padded), sampling
  ``--new-tokens`` tokens per row with no stop (the issue's baseline: its default dynamic cache).
* **engine, eager**: the rollout engine (multi-turn, retrieval, per-row random streams as in RL)
  on its static slot cache, one forward per decode step (``decode_graphs="off"``).
* **engine, graphs**: the same with every decode step a replayed CUDA graph (``"auto"``), around
  the model's own attention (transformers' SDPA, which repeats the key/value heads given a mask);
* **engine, graphs-barrier**: the graphs side with ``resume_early=False``: rows that closed their
  action wait for the turn's longest one (what the engine did before), to show what resuming is worth;
* **engine, graphs-grouped**: the same graphs with the engine's grouped attention over the slot
  pool (``grouped_attention``: each key and value read once), to show what the attention is worth.
* **engine, graphs-compiled**: the graphs of the step compiled whole (``compile_decode``): the
  step's small elementwise kernels fused around the matrix products, then captured; its first
  call pays the compilation. Its sampled agreement with the graphs side is reported too.

Each graphed side runs once to warm up (it captures its graphs then; capture time is reported
apart), then every side is timed ``--repeats`` times, best kept (the eager engine runs the kernels
HF generate has warmed). ``--sides`` picks the extra engine sides (both by default);
``--compile-norms`` runs the engine sides with the model's RMSNorms fused (HF generate stays stock). Reported: model-written tokens per
second, the ratios against HF generate and against the eager engine, the retriever's share of the
graphs side's wall time, and how far the two engine sides agree: sampled with the same per-row
streams, and greedy, the share of rows whose completions are identical, and the largest gap
between their log-probabilities over the tokens both wrote (bf16: near-ties can flip a token).
Target (issue 20): graphs >= 10x HF generate at batch 64 on a Qwen3-0.6B shape, the retriever never
the bottleneck. ``--shape tiny --device cpu`` runs the same code on a CPU (the graphs side's static step uncaptured).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.agent.decode_graphs import SLOT_ATTENTION, DecodeGraphs
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.data.jsonl import write_json
from prorag.data.records import read_passages, read_records
from prorag.data.world import build_world
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever

#: Model shapes: Qwen3-0.6B's, and a tiny one for CPU runs of the script itself.
SHAPES = {
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16
    ),
}
QWEN3_VOCAB = 151_936
#: Probability per token the head's bias gives each tag, on top of near-uniform random logits.
TAG_RATES = {"<subquery>": 0.03, "</subquery>": 0.02, "</subanswer>": 0.01, "</answer>": 0.002}


def qwen3_shaped(tokenizer: Any, shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """A random Qwen3 of ``shape`` whose head (with a bias) samples only the tokenizer's ids and
    writes the tags at :data:`TAG_RATES` per token. The vocabulary is padded to Qwen3's, so the
    head and the softmax cost what Qwen3-0.6B's do."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    n = len(tokenizer)
    vocab = QWEN3_VOCAB if shape == "qwen3-0.6b" else n
    cfg = Qwen3Config(
        **SHAPES[shape],
        vocab_size=vocab,
        max_position_embeddings=40_960,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
        head = torch.nn.Linear(cfg.hidden_size, vocab, bias=True)
        torch.nn.init.normal_(head.weight, std=0.02)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[n:] = -1e4
        v = tokenizer.get_vocab()
        for tag, rate in TAG_RATES.items():  # near-uniform logits over n ids: p(tag) ~ e^b / n
            head.bias[v[tag]] = math.log(rate * n)
    model.lm_head = head
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device=device, dtype=dtype).eval()


@contextlib.contextmanager
def greedy_tag_bias(model: Any, tokenizer: Any) -> Iterator[None]:
    """Tag biases for greedy decoding: near the largest random logit of a row (3.3 standard
    deviations of ``h . w``, ``h`` of unit RMS, ``w`` of std 0.02), so that the argmax is
    sometimes a tag and sometimes a word and greedy rollouts have several actions. (With the
    sampling biases a tag would always be the argmax: every action one repeated tag.)"""
    head = model.lm_head
    v = tokenizer.get_vocab()
    ids = [v[t] for t in TAG_RATES]
    saved = head.bias[ids].clone()
    with torch.no_grad():
        head.bias[ids] = 3.3 * 0.02 * math.sqrt(head.in_features)
    try:
        yield
    finally:
        with torch.no_grad():
            head.bias[ids] = saved


class TimedRetriever:
    """The retriever with a stopwatch: seconds spent in ``search`` (the engine's only call)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def search(self, *args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner.search(*args, **kw)
        finally:
            self.seconds += time.perf_counter() - start


class StepClock:
    """Seconds spent in the parts of a rollout (``--profile``): each wrapped call is bracketed by
    device synchronisations, so the parts add up (and the run is a little slower than unprofiled)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.rows = 0

    def wrap(self, owner: Any, name: str, part: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kw: Any) -> Any:
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = inner(*args, **kw)
            torch.cuda.synchronize()
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
            self.calls[part] = self.calls.get(part, 0) + 1
            if part == "decode step":
                self.rows += len(args[1] if len(args) > 1 else kw["tokens"])
            return out

        setattr(owner, name, timed)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_generate(model: Any, prompts: list[list[int]], pad_id: int, new_tokens: int, device: str) -> tuple[float, int]:
    """Seconds and generated tokens of one HF ``generate`` call over the left-padded prompts."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p)
        mask[r, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    sync(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=pad_id,
    )
    sync(device)
    return time.perf_counter() - start, (out.shape[1] - width) * len(prompts)


def time_engine(engine: RolloutEngine, records: list[Any], seeds: list[int], device: str) -> tuple[float, int, list[Any]]:
    """Seconds, model-written tokens and trajectories of one rollout of ``records``."""
    sync(device)
    start = time.perf_counter()
    trajs = engine.rollout(records, row_seeds=seeds)
    sync(device)
    return time.perf_counter() - start, sum(sum(t.env_mask) for t in trajs), trajs


def agreement(a: list[Any], b: list[Any]) -> tuple[float, float]:
    """Share of identical completions, and the largest log-probability gap over the tokens both
    sides wrote alike (up to the first difference of each pair)."""
    same, gap = 0, 0.0
    for x, y in zip(a, b, strict=True):
        same += x.completion_ids == y.completion_ids
        for tx, ty, lx, ly, m in zip(x.completion_ids, y.completion_ids, x.logprobs, y.logprobs, x.env_mask, strict=False):
            if tx != ty:
                break
            if m:
                gap = max(gap, abs(lx - ly))
    return same / len(a), gap


def progress(result: dict[str, Any], name: str, side: dict[str, Any], out: Path | None) -> None:
    """Print one line as a side finishes and save what is measured so far: a run stopped by its time
    limit (a device is lent for minutes) still leaves the sides it finished, in the log and in ``out``."""
    rate = side["tokens"] / side["seconds"]
    extra = ""
    if "graphs_after" in side:
        extra = f", {side['graphs_after']} graphs, {side['capture_failures']} failed captures"
    print(f"done: {name}, {side['tokens']} tokens in {side['seconds']:.2f} s ({rate:,.0f} tokens/s{extra})", flush=True)
    if out:
        write_json(out, result | {"finished": False})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens per row of the HF generate baseline")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per side (best kept)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile", action="store_true", help="then time the graphs side's parts (GPU only)")
    ap.add_argument(
        "--compile-norms",
        action="store_true",
        help="the engine sides run with the model's RMSNorms compiled (prorag.core.kernels.compile_norms); HF generate stock",
    )
    ap.add_argument(
        "--sides",
        default="graphs-barrier,graphs-grouped",
        help="engine sides beside eager and graphs (always run): graphs-barrier, graphs-grouped, graphs-compiled "
        "(the step compiled whole before capture, compile_decode), or none",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device, dtype = args.device, getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory() as tmp:
        build_world(tmp, seed=0, size="demo")
        tokenizer = train_world_tokenizer(world_tokenizer_texts(tmp))
        retriever = TimedRetriever(BM25Retriever(read_passages(Path(tmp) / "corpus.jsonl")))
        records = read_records(Path(tmp) / "test.jsonl")[: args.batch]
    model = qwen3_shaped(tokenizer, args.shape, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    # RL's caps (METHOD.md: 11 actions during RL), sampling at temperature 1 with per-row streams.
    cfg = RolloutConfig(max_actions=11, max_action_tokens=128, max_completion_tokens=2048, batch_size=args.batch, seed=0)
    seeds = [1000 + i for i in range(len(records))]
    sides: dict[str, RolloutEngine] = {"eager": RolloutEngine(model, tokenizer, retriever, replace(cfg, decode_graphs="off"))}
    # Off a GPU the graphs side runs the same static step uncaptured: the script checks itself on a CPU.
    sides["graphs"] = RolloutEngine(
        model, tokenizer, retriever, replace(cfg, decode_graphs="auto" if device.startswith("cuda") else "eager")
    )
    extra = set(args.sides.split(",")) - {"none", ""}
    if unknown := extra - {"graphs-barrier", "graphs-grouped", "graphs-compiled"}:
        ap.error(f"--sides: unknown side(s) {sorted(unknown)}")
    # The same graphs with every row waiting for its turn's longest action (the engine before resume_early).
    if "graphs-barrier" in extra:
        sides["graphs-barrier"] = RolloutEngine(model, tokenizer, retriever, replace(sides["graphs"].config, resume_early=False))
    # The same graphs of the step compiled whole (its first call pays the compilation and the captures).
    if "graphs-compiled" in extra:
        sides["graphs-compiled"] = RolloutEngine(
            model, tokenizer, retriever, replace(sides["graphs"].config, compile_decode=True)
        )
    if "graphs-grouped" in extra and device.startswith("cuda"):  # the same graphs around the grouped attention
        sides["graphs-grouped"] = RolloutEngine(model, tokenizer, retriever, replace(cfg, decode_graphs="auto"))
        sides["graphs-grouped"].graphs = DecodeGraphs(
            model, len(records), torch.device(device), capture=True, attention=SLOT_ATTENTION
        )
    prompts = [sides["eager"].prompt_ids(r.question) for r in records]

    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "machine": machine_name(device),
        "shape": args.shape,
        "parameters": params,
        "dtype": args.dtype,
        "batch": len(records),
        "torch": torch.__version__,
    }
    time_generate(model, prompts[:2], tokenizer.pad_token_id, 8, device)  # warm-up
    best = min(time_generate(model, prompts, tokenizer.pad_token_id, args.new_tokens, device) for _ in range(args.repeats))
    result["generate"] = {"seconds": best[0], "tokens": best[1], "tokens_per_s": best[1] / best[0]}
    progress(result, "HF generate", result["generate"], args.out)
    if args.compile_norms:
        from prorag.core.kernels import compile_norms

        start = time.perf_counter()
        result["compiled_norms"] = compile_norms(model)
        time_engine(sides["eager"], records[:2], seeds[:2], device)  # the compilation, outside the timed runs
        result["compile_seconds"] = time.perf_counter() - start

    trajectories = {}
    for name, engine in sides.items():
        retriever.seconds = 0.0
        # The graphed sides capture in their first call; the eager one runs the kernels HF generate warmed.
        side: dict[str, Any] = {}
        if engine.config.decode_graphs != "off":
            side["first_call_seconds"] = time_engine(engine, records, seeds, device)[0]
        if engine.graphs is not None:
            side["graphs_captured"] = engine.graphs.captures
        runs = []
        for _ in range(args.repeats):
            retriever.seconds = 0.0
            seconds, tokens, trajs = time_engine(engine, records, seeds, device)
            runs.append((seconds, tokens, retriever.seconds, trajs))
        seconds, tokens, retrieval, trajs = min(runs, key=lambda r: r[0])
        trajectories[name] = trajs
        side |= {
            "seconds": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / seconds,
            "retriever_seconds": retrieval,
            "retriever_share": retrieval / seconds,
            "searches_per_row": sum(t.num_searches for t in trajs) / len(trajs),
            "actions_per_row": sum(len(t.actions) for t in trajs) / len(trajs),
        }
        if engine.graphs is not None:
            side["graphs_after"] = engine.graphs.captures
            side["capture_failures"] = engine.graphs.capture_failures
        result[name] = side
        progress(result, name, side, args.out)

    result["sampled_agreement"], result["sampled_logprob_gap"] = agreement(trajectories["eager"], trajectories["graphs"])
    if "graphs-compiled" in trajectories:
        result["compiled_sampled_agreement"], result["compiled_sampled_logprob_gap"] = agreement(
            trajectories["graphs"], trajectories["graphs-compiled"]
        )
    with greedy_tag_bias(model, tokenizer):
        greedy = {
            name: RolloutEngine(model, tokenizer, retriever, replace(sides[name].config, greedy=True)).rollout(records)
            for name in ("eager", "graphs")
        }
    result["greedy_agreement"], result["greedy_logprob_gap"] = agreement(greedy["eager"], greedy["graphs"])
    result["greedy_actions_per_row"] = sum(len(t.actions) for t in greedy["graphs"]) / len(records)

    gen = result["generate"]["tokens_per_s"]
    print(
        f"{result['machine']}, {args.shape} shape ({params:,} parameters, {args.dtype}), batch {len(records)}, torch {torch.__version__}"
    )
    print(f"{'side':<16}{'tokens':>8}{'seconds':>9}{'tok/s':>9}{'vs generate':>13}{'retriever':>11}{'searches/row':>14}")
    print(f"{'HF generate':<16}{result['generate']['tokens']:>8}{result['generate']['seconds']:>9.2f}{gen:>9.0f}{1:>12.2f}x")
    for name in sides:
        s = result[name]
        print(
            f"{'engine ' + name:<16}{s['tokens']:>8}{s['seconds']:>9.2f}{s['tokens_per_s']:>9.0f}{s['tokens_per_s'] / gen:>12.2f}x"
            f"{s['retriever_share']:>10.1%}{s['searches_per_row']:>14.2f}"
        )
    g = result["graphs"]
    print(
        f"graphs over eager: {g['tokens_per_s'] / result['eager']['tokens_per_s']:.2f}x; {g['graphs_captured']} graphs captured "
        f"in the first call ({g['first_call_seconds']:.1f} s), {g['graphs_after'] - g['graphs_captured']} more in the timed ones, "
        f"{g['capture_failures']} failed captures"
    )
    print(
        f"engine eager vs graphs: sampled {result['sampled_agreement']:.2f} identical rows (max logprob gap "
        f"{result['sampled_logprob_gap']:.1e}), greedy {result['greedy_agreement']:.2f} (gap {result['greedy_logprob_gap']:.1e})"
    )
    if "graphs-compiled" in result:
        c = result["graphs-compiled"]
        print(
            f"graphs of the compiled step over graphs: {c['tokens_per_s'] / g['tokens_per_s']:.2f}x (first call, compiling "
            f"and capturing, {c['first_call_seconds']:.1f} s); sampled rows identical to the graphs side's: "
            f"{result['compiled_sampled_agreement']:.2f} (max logprob gap {result['compiled_sampled_logprob_gap']:.1e})"
        )
    best = max((result[name]["tokens_per_s"] for name in ("graphs", "graphs-compiled") if name in result), default=0.0)
    ratio = best / gen
    print(f"target: graphs >= 10x HF generate: {ratio:.1f}x, {'met' if ratio >= 10 else 'NOT met'}")
    if args.compile_norms:
        print(f"engine sides with {result['compiled_norms']} RMSNorms compiled ({result['compile_seconds']:.1f} s to compile)")
    if args.profile and device.startswith("cuda"):
        from prorag.agent import decode_graphs, kv_cache

        clock = StepClock()
        clock.wrap(decode_graphs.DecodeGraphs, "decode", "decode step")
        clock.wrap(kv_cache.SlotState, "feed", "prefill and env chunks")
        clock.wrap(RolloutEngine, "_sample", "sampling")
        clock.wrap(RolloutEngine, "_search", "retrieval")
        seconds = time_engine(sides["graphs"], records, seeds, device)[0]
        steps = clock.calls.get("decode step", 0)
        result["profile"] = {
            "seconds": seconds,
            "parts": clock.seconds,
            "calls": clock.calls,
            "rows_per_step": clock.rows / max(steps, 1),
        }
        print(
            f"profile of the graphs side ({seconds:.2f} s, {steps} decode steps, {clock.rows / max(steps, 1):.1f} rows per step):"
        )
        for part, sec in clock.seconds.items():
            print(f"  {part:<24}{sec:>8.2f} s{sec / seconds:>8.1%}{1000 * sec / clock.calls[part]:>9.2f} ms/call")
        rest = seconds - sum(clock.seconds.values())
        print(f"  {'the loop itself':<24}{rest:>8.2f} s{rest / seconds:>8.1%}")
    if args.out:
        write_json(args.out, result | {"finished": True})


if __name__ == "__main__":
    main()
