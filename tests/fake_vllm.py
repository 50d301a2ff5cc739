"""A stand-in for vLLM (which cannot be installed in this project's test environment), installed
as the ``vllm`` module by :func:`install`.

Written against vLLM's own source as TRL 1.16 drives it (vLLM 0.22 to 0.31; read: the main
branch's ``vllm/sampling_params.py``, ``vllm/outputs.py``, ``vllm/logprobs.py``,
``vllm/v1/core/sched/utils.py::check_stop``, ``vllm/v1/engine/parallel_sampling.py`` and the v1
sampler's ``TopKTopPSampler.forward_native``). It follows the shapes and rules the rollout loop
relies on: ``LLM.generate`` takes ``{"prompt_token_ids": ...}`` prompts and one ``SamplingParams``
per prompt (or one for all) and returns one ``RequestOutput`` per prompt, in order, with ``n``
``CompletionOutput`` (``token_ids``, ``logprobs`` as a list of ``{token_id: Logprob(logprob, rank,
decoded_token)}``, ``finish_reason`` ``"stop"``/``"length"``, ``stop_reason`` the stop id or
``None`` for the end-of-sequence token); the sampled token is appended before the stop check, and
stop ids are checked before the length; child ``i`` of a request with ``n`` and a seed samples
with ``seed + i``; greedy requests refuse ``n`` > 1; ``logprobs_mode`` ``raw_logprobs`` (vLLM's
default: before temperature) or ``processed_logprobs`` (after temperature and top-p, renormalised);
sampling by vLLM's exponential race (``argmax(probs / Exp(1))``). The model is any causal LM
called on the whole context each step (no KV cache): a scripted test model registered in
:data:`MODELS`, or a folder loaded with ``AutoModelForCausalLM``. ``load_weights`` through
``llm.llm_engine.model_executor.driver_worker.model_runner.model`` copies weights into it, as TRL's
colocated weight sync does.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

#: Models by the name ``LLM(model=...)`` is given (scripted test models have no folder).
MODELS: dict[str, Any] = {}

VERSION = "0.31.0"


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.temperature < 1e-5:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None = None


class _Model:
    """What ``driver_worker.model_runner.model`` is: ``load_weights`` into the wrapped torch model."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, value in weights:
                params[name].copy_(value.to(params[name].dtype))


@dataclass
class _Engine:
    model_runner: Any = None


class LLM:
    """vLLM's offline engine (see the module docstring); every call is recorded in :attr:`calls`."""

    instances: list[LLM] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model_name = model
        self.kwargs = kwargs
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if model in MODELS:
            self.model = MODELS[model]
        else:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(model)
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_id = eos_ids[0] if eos_ids else None
        self.extra_eos = eos_ids[1:]
        self.generator = torch.Generator().manual_seed(int(kwargs.get("seed") or 0))
        self.calls: list[tuple[list[list[int]], list[SamplingParams]]] = []
        self.sleeping = False
        self.prefix_resets = 0
        runner = types.SimpleNamespace(model=_Model(self.model))
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)),
            model_config=types.SimpleNamespace(max_model_len=kwargs.get("max_model_len") or 4096),
        )
        LLM.instances.append(self)

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True

    def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False

    def generate(self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True, **_: Any) -> list[RequestOutput]:
        if self.sleeping:
            raise RuntimeError("generate() on a sleeping engine")
        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        self.calls.append((ids, params))
        return [self._request(str(k), p, sp) for k, (p, sp) in enumerate(zip(ids, params, strict=True))]

    def _request(self, request_id: str, prompt: list[int], sp: SamplingParams) -> RequestOutput:
        outs = []
        for i in range(sp.n):
            gen = torch.Generator().manual_seed(sp.seed + i) if sp.seed is not None else self.generator
            outs.append(self._complete(i, prompt, sp, gen))
        return RequestOutput(request_id, None, prompt, None, outs, True)

    @torch.no_grad()
    def _complete(self, index: int, prompt: list[int], sp: SamplingParams, gen: torch.Generator) -> CompletionOutput:
        seq = list(prompt)
        out: list[int] = []
        lps: list[dict[int, Logprob]] = []
        stops = set(sp.stop_token_ids or []) | set(self.extra_eos)
        while True:
            x = torch.tensor([seq])
            logits = self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].float()
            raw = torch.log_softmax(logits, -1)
            if sp.temperature < 1e-5:
                processed = raw
                tok = int(logits.argmax())
            else:
                scaled = _top_p(logits / sp.temperature, sp.top_p)
                processed = torch.log_softmax(scaled, -1)
                q = torch.empty_like(processed).exponential_(generator=gen)
                tok = int((processed.exp() / q).argmax())
            chosen = processed if self.logprobs_mode == "processed_logprobs" else raw
            out.append(tok)
            seq.append(tok)
            if sp.logprobs is not None:
                rank = int((chosen > chosen[tok]).sum()) + 1
                lps.append({tok: Logprob(float(chosen[tok]), rank, None)})
            if not sp.ignore_eos and tok == self.eos_token_id:
                return CompletionOutput(index, "", out, None, lps if sp.logprobs is not None else None, "stop", None)
            if tok in stops:
                return CompletionOutput(index, "", out, None, lps if sp.logprobs is not None else None, "stop", tok)
            if sp.max_tokens is not None and len(out) >= sp.max_tokens:
                return CompletionOutput(index, "", out, None, lps if sp.logprobs is not None else None, "length", None)


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """vLLM's top-p: sort ascending, drop the tokens whose cumulative mass stays within ``1 - p`` (the last kept)."""
    if p >= 1.0:
        return logits
    values, index = logits.sort(descending=False)
    cumulative = values.softmax(-1).cumsum(-1)
    drop = cumulative <= 1 - p
    drop[-1] = False
    values = values.masked_fill(drop, float("-inf"))
    return values.scatter(0, index, values)


def install(monkeypatch: Any) -> types.ModuleType:
    """Put this fake in ``sys.modules`` as ``vllm`` (and its submodules) for one test."""
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # found by importlib.util.find_spec, as an installed one
    vllm.__version__ = VERSION
    vllm.LLM, vllm.SamplingParams, vllm.RequestOutput, vllm.CompletionOutput = (
        LLM,
        SamplingParams,
        RequestOutput,
        CompletionOutput,
    )
    vllm.TokensPrompt = dict
    subs = {
        "vllm.sampling_params": {"SamplingParams": SamplingParams},
        "vllm.outputs": {"RequestOutput": RequestOutput, "CompletionOutput": CompletionOutput},
        "vllm.logprobs": {"Logprob": Logprob},
    }
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    for name, members in subs.items():
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for key, value in members.items():
            setattr(module, key, value)
        setattr(vllm, name.split(".")[1], module)
        monkeypatch.setitem(sys.modules, name, module)
    LLM.instances = []
    return vllm
