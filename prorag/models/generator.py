"""Text generators: prompts in, text (and, when asked, per-token log-probabilities) out.

The inference-time baselines (Iter-RetGen, IRCoT, FLARE, Search-o1, and naive / standard RAG
on a generator) only need "continue these prompts", so they run on any :class:`TextGenerator`:

* :class:`HFGenerator`: a local Hugging Face causal LM, batched, greedy at temperature 0;
* ``prorag.models.served.ServedGenerator``: an OpenAI-compatible server (vLLM, SGLang, an API);
* :class:`ScriptedGenerator`: replies from a function, for tests of a method's control flow.

The contract is the OpenAI completions one: one :class:`Generation` per prompt, in order; the
text stops *before* the first stop string (the stop string is not included); ``finish_reason``
is ``"stop"`` when a stop string or end-of-sequence ended it, ``"length"`` when ``max_tokens`` did,
``"over_long"`` when the prompt left no room for ``max_tokens`` in the model's positions (an empty
generation: the prompt was not sent, :func:`fits_context`).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prorag.agent.context_budget import policy_max_length
from prorag.core.setting_checks import check_temperature

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """One completion: its text, optionally its tokens with their log-probabilities, and its cost."""

    text: str
    token_logprobs: list[float] | None = None
    tokens: list[str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"


@dataclass(frozen=True)
class Sampling:
    """How to continue a batch of prompts: the settings every backend reads alike (one request)."""

    max_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    logprobs: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        check_temperature(self.temperature, "temperature")
        object.__setattr__(self, "stop", tuple(self.stop))


class TextGenerator(Protocol):
    """Anything that continues prompts (batching and concurrency are its own business).

    A backend subclasses it and implements :meth:`complete`; :meth:`generate` is the keyword form
    every caller uses, so the argument handling stands here once."""

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        logprobs: bool = False,
    ) -> list[Generation]:
        """One :class:`Generation` per prompt, in order."""
        return self.complete(prompts, Sampling(max_tokens, tuple(stop), temperature, logprobs))

    @abstractmethod
    def complete(self, prompts: Sequence[str], sampling: Sampling) -> list[Generation]:
        """:meth:`generate` with its settings in one :class:`Sampling` (what a backend implements;
        abstract, so a backend that forgets it fails when built, not when first called)."""


def fits_context(prompt_tokens: int, max_tokens: int, max_length: int | None) -> bool:
    """Whether a prompt of ``prompt_tokens`` leaves room for ``max_tokens`` new ones in a model of
    ``max_length`` positions (no known maximum: it fits). A prompt that does not is never sent to
    the model: past its positions a model fails or reads garbage, and a very long prompt exhausts
    memory in its first forward pass; the caller gets :func:`over_long_generation` instead."""
    return max_length is None or prompt_tokens + max_tokens <= max_length


def over_long_generation(prompt_tokens: int, logprobs: bool = False) -> Generation:
    """The empty generation of a prompt that does not fit (``finish_reason`` ``over_long``): the
    baseline reads no answer from it, so the question scores 0, and the evaluation counts it."""
    return Generation(
        text="",
        token_logprobs=[] if logprobs else None,
        tokens=[] if logprobs else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
        finish_reason="over_long",
    )


def cut_at_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index of the earliest stop string in ``text`` (``None`` when there is none): where the
    completion ends, the stop string excluded, as an OpenAI-compatible server cuts it."""
    found = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(found) if found else None


class ScriptedGenerator(TextGenerator):
    """A generator whose reply to a prompt is ``replies(prompt)`` (a string or a whole
    :class:`Generation`), for tests. Stop strings are honoured on string replies; token counts are
    whitespace words (prompt) and the reply's words, so a test can hand-compute them. Every prompt
    seen is kept in :attr:`calls`, every request's keyword arguments in :attr:`requests`."""

    def __init__(self, replies: Callable[[str], str | Generation]) -> None:
        self.replies = replies
        self.calls: list[str] = []
        self.requests: list[dict[str, Any]] = []

    def complete(self, prompts: Sequence[str], sampling: Sampling) -> list[Generation]:
        stop = sampling.stop
        self.requests.append(
            {"n": len(prompts), "max_tokens": sampling.max_tokens, "stop": list(stop), "logprobs": sampling.logprobs}
        )
        out = []
        for prompt in prompts:
            self.calls.append(prompt)
            reply = self.replies(prompt)
            if isinstance(reply, str):
                cut = cut_at_stop(reply, stop)
                text = reply if cut is None else reply[:cut]
                reply = Generation(text, completion_tokens=len(text.split()))
            if not reply.prompt_tokens:
                reply.prompt_tokens = len(prompt.split())
            out.append(reply)
        return out


def _kept_tokens(pieces: Sequence[str], end: int) -> int:
    """How many tokens lie wholly before character ``end``, given the decoded prefixes ``pieces``
    (``pieces[i]`` = the text of tokens ``0..i``): a token that straddles a stop string is dropped."""
    n = 0
    while n < len(pieces) and len(pieces[n]) <= end:
        n += 1
    return n


class HFGenerator(TextGenerator):
    """A local Hugging Face causal LM as a :class:`TextGenerator`.

    Prompts are tokenised as given (no special tokens added: a chat prompt already carries its
    template), left-padded in batches of ``batch_size``, and continued by ``model.generate``,
    greedy at temperature 0. Stop strings are applied to the decoded text after generation (so a
    batch decodes to ``max_tokens`` at most); the log-probabilities are those of the tokens kept,
    under the model's own distribution (its logits before temperature or other processors)."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 16, device: str | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"HFGenerator batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = device or str(next(model.parameters()).device)
        self.max_length = policy_max_length(model, tokenizer)

    def complete(self, prompts: Sequence[str], sampling: Sampling) -> list[Generation]:
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        fits = [i for i, x in enumerate(ids) if fits_context(len(x), sampling.max_tokens, self.max_length)]
        if len(fits) < len(prompts):
            log.warning(
                "%d of %d prompts leave no room for %d new tokens in the model's %s positions: not generated "
                "(an empty generation, finish_reason over_long)",
                len(prompts) - len(fits),
                len(prompts),
                sampling.max_tokens,
                self.max_length,
            )
        out: list[Generation] = [over_long_generation(len(x), sampling.logprobs) for x in ids]
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start : start + self.batch_size]
            for i, g in zip(chunk, self._batch([ids[i] for i in chunk], sampling), strict=True):
                out[i] = g
        return out

    def _batch(self, ids: Sequence[list[int]], sampling: Sampling) -> list[Generation]:
        import torch

        max_tokens, stop, temperature, logprobs = sampling.max_tokens, sampling.stop, sampling.temperature, sampling.logprobs

        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=self.device)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            res = self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                pad_token_id=pad_id,
                eos_token_id=tok.eos_token_id,
                return_dict_in_generate=True,
                output_logits=logprobs,
                **sampling,
            )
        new = res.sequences[:, width:]
        token_lp = None
        if logprobs:
            # The model's own logits (before any sampling processor): FLARE's confidence is the model's.
            steps = torch.stack(list(res.logits), dim=1).float().log_softmax(-1)
            token_lp = steps.gather(-1, new[:, : steps.shape[1], None]).squeeze(-1).tolist()
        return [
            self._one(new[i].tolist(), len(ids[i]), stop, max_tokens, token_lp[i] if token_lp is not None else None)
            for i in range(len(ids))
        ]

    def _one(self, ids: list[int], n_prompt: int, stop: Sequence[str], max_tokens: int, lps: list[float] | None) -> Generation:
        tok = self.tokenizer
        eos = tok.eos_token_id
        ended = eos in ids
        if ended:
            ids = ids[: ids.index(eos)]
        pieces = [tok.decode(ids[: i + 1], skip_special_tokens=True) for i in range(len(ids))]
        text = pieces[-1] if pieces else ""
        cut = cut_at_stop(text, stop)
        if cut is not None:
            ids = ids[: _kept_tokens(pieces, cut)]
            pieces, text = pieces[: len(ids)], text[:cut]
        tokens = [p[len(pieces[i - 1]) if i else 0 :] for i, p in enumerate(pieces)]
        finish = "stop" if ended or cut is not None or len(ids) < max_tokens else "length"
        return Generation(
            text=text,
            token_logprobs=lps[: len(ids)] if lps is not None else None,
            tokens=tokens if lps is not None else None,
            prompt_tokens=n_prompt,
            completion_tokens=len(ids),
            finish_reason=finish,
        )


__all__ = [
    "Generation",
    "HFGenerator",
    "Sampling",
    "ScriptedGenerator",
    "TextGenerator",
    "cut_at_stop",
    "fits_context",
    "over_long_generation",
]
