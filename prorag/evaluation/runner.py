"""``prorag eval`` from files: the records, the index and a policy or a generator in, the harness's
outputs out. A run goes to the rollout engine (:func:`~prorag.evaluation.harness.evaluate`) or, for a
served or HF generator and for the baselines that only exist on a generator, to
:func:`~prorag.evaluation.generator_eval.evaluate_generator`; ``acc_l`` is judged afterwards when
the config names a judge. Kept apart from both so that neither imports the other's runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorag.core.errors import DataError
from prorag.data.records import read_records
from prorag.evaluation.eval_config import EvalConfig
from prorag.evaluation.generator_eval import GeneratorBaseline, evaluate_generator
from prorag.evaluation.harness import evaluate


def evaluate_files(
    policy: str | None,
    data: str | Path,
    index: str,
    out_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    device: str | None = None,
) -> dict[str, Any]:
    """``prorag eval``: load a policy (checkpoint folder or hub id) or a served model, the records and
    the index, evaluate; then judge ``acc_l`` when ``config.judge`` is set. A record file without a
    record is refused before anything is written."""
    from prorag.models.checkpoints import load_sampler
    from prorag.retrieval.index import open_retriever

    cfg = config or EvalConfig()
    records = read_records(data)  # bad input refused before the model loads, and before anything is written
    if not records:
        raise DataError(str(data), "no records (an empty file): nothing to evaluate; nothing written")
    retriever = open_retriever(index)
    judge = cfg.judge.generator() if cfg.judge is not None else None  # likewise the judge's endpoint and prompt
    if uses_generator(cfg):
        generator = cfg.generator.build(policy, device=device)
        metrics = evaluate_generator(generator, records, retriever, out_dir, cfg)
    else:
        model, tokenizer = load_sampler(policy, cfg.rollout_config(), device=device)
        metrics = evaluate(model, tokenizer, records, retriever, out_dir, cfg)
    if cfg.judge is not None:
        from prorag.evaluation.llm_judge import add_acc_l

        metrics = add_acc_l(out_dir, cfg.judge, judge)
    return metrics


def uses_generator(config: EvalConfig) -> bool:
    """Whether ``config`` runs on a TextGenerator (``evaluate_generator``) rather than the rollout
    engine: a ``hf`` or ``served`` generator, or a baseline that only exists on a generator
    (Iter-RetGen, IRCoT, FLARE, Search-o1: a ``GeneratorBaseline``)."""
    if config.generator.kind != "engine":
        return True
    if config.baseline is None:
        return False
    return isinstance(config.baseline_runner(), GeneratorBaseline)


__all__ = ["evaluate_files", "uses_generator"]
