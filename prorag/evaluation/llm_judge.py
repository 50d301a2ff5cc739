"""LLM-judge accuracy ``acc_l`` (ACC_L of CP-Search and P2S): an LLM decides whether a prediction
means the same as a gold answer.

The judge is any OpenAI-compatible endpoint, reached through the served client
(:class:`prorag.models.served.ServedGenerator`) or any :class:`~prorag.models.generator.TextGenerator`.
Its prompt is the file ``prompts/acc_l.txt`` shipped with the package (or ``JudgeConfig.prompt_file``),
so the number can be reproduced and audited. Replies are parsed strictly (:func:`parse_verdict`):
``yes`` or ``no`` alone, case and a final period aside; anything else is *unparsable*, counted
and scored wrong, never guessed. Verdicts are cached in a JSONL keyed by judge model and prompt,
so rerunning an evaluation (or a Table 1 cell) asks nothing twice.

``acc_l`` = judged-correct predictions / all predictions; a question without a prediction is
wrong without a request. ``acc_l_unparsable`` says how many replies could not be read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorag.core.config import config_from_dict, setting
from prorag.data.jsonl import JsonlAppender, read_json, read_jsonl, write_json, write_jsonl
from prorag.supervision.equivalence import prompt_template

log = logging.getLogger(__name__)

#: The shipped judge prompt; fields ``{question}``, ``{golden_answers}``, ``{prediction}``.
ACC_L_PROMPT = Path(__file__).with_name("prompts") / "acc_l.txt"
#: The fields a judge prompt must contain.
PROMPT_FIELDS = ("{question}", "{golden_answers}", "{prediction}")


@dataclass
class JudgeConfig:
    """The LLM judge of ``acc_l``: its endpoint, prompt, cache."""

    served: dict[str, Any] = setting(
        factory=dict,
        help="The judge endpoint: ServedConfig fields (prorag.models.served), e.g. {base_url: http://127.0.0.1:8000/v1, "
        "model: Qwen/Qwen3-8B, api: chat, api_key_env: null}.",
    )
    prompt_file: str | None = setting(None, help="Judge prompt file (default: the shipped prompts/acc_l.txt).")
    cache_path: str | None = setting(None, help="Verdict cache JSONL (default: OUT/acc_l_cache.jsonl).")
    max_tokens: int = setting(4, help="Tokens of the judge's reply (one word is asked for).")

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"JudgeConfig.max_tokens must be >= 1, got {self.max_tokens}")

    def template(self) -> str:
        """The judge prompt; a file without the three fields is refused (it would judge nothing)."""
        return prompt_template(Path(self.prompt_file) if self.prompt_file else ACC_L_PROMPT, PROMPT_FIELDS)

    def generator(self) -> Any:
        """The served client of the judge endpoint (the ``served`` block checked as a ServedConfig),
        after checking the prompt, so a bad judge is refused before an evaluation runs."""
        self.template()
        if not self.served:
            raise ValueError("judge.served is empty: give the judge endpoint (base_url, model, ...)")
        from prorag.models.endpoint_config import ServedConfig
        from prorag.models.served import ServedGenerator

        return ServedGenerator(config_from_dict(ServedConfig, dict(self.served), "judge.served"))


def judge_prompt(template: str, question: str, golden_answers: Sequence[str], prediction: str) -> str:
    """The judge prompt for one prediction (gold aliases joined by `` | ``); ``str.replace``
    rather than ``format`` so braces in questions or answers are left alone."""
    return (
        template.replace("{question}", question)
        .replace("{golden_answers}", " | ".join(golden_answers))
        .replace("{prediction}", prediction)
    )


def parse_verdict(reply: str) -> bool | None:
    """``True`` for ``yes``, ``False`` for ``no``, ``None`` for anything else.

    Strict on purpose: only the one word, ignoring case, surrounding whitespace and one final
    period. "Yes, but ..." or "The answer is correct" is unparsable rather than read as yes, so
    a talkative judge shows up in the unparsable count instead of inflating accuracy.
    """
    word = reply.strip().lower()
    word = word[:-1] if word.endswith(".") else word
    return {"yes": True, "no": False}.get(word)


def _cache_key(model: str, prompt: str) -> str:
    from prorag.models.served import request_key  # with the client (asyncio): imported when a judge runs

    return request_key({"judge_model": model, "prompt": prompt})


def judge_rows(
    rows: Sequence[dict[str, Any]], generator: Any, template: str, cache_path: Path, *, model: str, max_tokens: int = 4
) -> list[dict[str, Any]]:
    """One verdict per prediction row: ``{id, verdict (bool | None), reply, cached}``.

    Rows need ``id``, ``question``, ``golden_answers`` and ``prediction``. Cached replies (keyed
    by ``model`` and prompt) are reused; the rest go to ``generator`` in one call (its own
    concurrency batches them) and are appended to the cache as they come back.
    """
    cache = {r["key"]: r["reply"] for r in read_jsonl(cache_path, tolerate_truncated_tail=True)} if cache_path.exists() else {}
    prompts = {
        r["id"]: judge_prompt(template, r["question"], r["golden_answers"], r["prediction"]) for r in rows if r.get("prediction")
    }
    keys = {i: _cache_key(model, p) for i, p in prompts.items()}
    asked = [i for i in prompts if keys[i] not in cache]
    fresh: dict[str, str] = {}
    if asked:
        replies = generator.generate([prompts[i] for i in asked], max_tokens=max_tokens, temperature=0.0)
        with JsonlAppender(cache_path) as out:
            for i, reply in zip(asked, replies, strict=True):
                fresh[i] = reply.text
                out.append({"key": keys[i], "reply": reply.text})
    verdicts = []
    for r in rows:
        if r["id"] not in prompts:
            verdicts.append({"id": r["id"], "verdict": False, "reply": None, "cached": False})
            continue
        reply = fresh[r["id"]] if r["id"] in fresh else cache[keys[r["id"]]]
        verdicts.append({"id": r["id"], "verdict": parse_verdict(reply), "reply": reply, "cached": r["id"] not in fresh})
    return verdicts


def acc_l_summary(verdicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``acc_l`` (correct / all, an unparsable reply counting wrong), ``acc_l_unparsable``, ``acc_l_n``."""
    if not verdicts:
        raise ValueError("no predictions to judge")
    correct = sum(v["verdict"] is True for v in verdicts)
    unparsable = sum(v["verdict"] is None for v in verdicts)
    if unparsable:
        log.warning("acc_l: %d of %d judge replies were not a plain yes/no (scored wrong)", unparsable, len(verdicts))
    return {"acc_l": correct / len(verdicts), "acc_l_unparsable": unparsable, "acc_l_n": len(verdicts)}


def add_acc_l(out_dir: str | Path, config: JudgeConfig, generator: Any = None) -> dict[str, Any]:
    """Judge ``OUT/predictions.jsonl``, write ``OUT/acc_l.jsonl`` (one verdict per question) and add
    ``acc_l``, ``acc_l_unparsable`` and ``acc_l_n`` to ``OUT/metrics.json``; return the metrics.

    ``generator`` defaults to the served client of ``config.served``.
    """
    out = Path(out_dir)
    metrics = read_json(out / "metrics.json")
    rows = list(read_jsonl(out / "predictions.jsonl", tolerate_truncated_tail=True))
    template = config.template()
    judge = generator if generator is not None else config.generator()
    model = str(config.served.get("model", "")) or type(judge).__name__
    cache_path = Path(config.cache_path) if config.cache_path else out / "acc_l_cache.jsonl"
    verdicts = judge_rows(rows, judge, template, cache_path, model=model, max_tokens=config.max_tokens)
    write_jsonl(out / "acc_l.jsonl", verdicts)
    metrics |= acc_l_summary(verdicts)
    write_json(out / "metrics.json", metrics)
    return metrics
