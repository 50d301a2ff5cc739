"""The rollout engine as TRL's ``rollout_func``, and the sampling stream of every row.

:class:`EngineRollout` hands TRL the engine's token ids as they were sampled (never re-encoded)
and its ``env_mask``, which TRL reads as ``tool_mask``: retrieved tokens get no loss. Each row
samples from a stream keyed by (seed, optimiser step, the row's index in the *global* generation
batch), so N processes sample what one process would (:func:`local_rows`, :func:`row_seed`).

With ``rollout.backend: vllm`` the loop drives the vLLM engine TRL owns (``trainer.vllm_generation``:
its colocated ``LLM``, or the client of ``trl vllm-serve``), which TRL keeps in sync with the trained
weights; the sampled log-probabilities go to TRL's importance-sampling correction.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from trl.models import unwrap_model_for_generation

from prorag.agent.backends.vllm import VLLMBackend, VLLMServerBackend
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.sampling import stream_seed
from prorag.data.records import Record
from prorag.retrieval.base import Retriever


def local_rows(process_index: int, num_local: int) -> slice:
    """Where this process's rows sit in the step's global generation batch.

    TRL 1.16's ``RepeatSampler`` yields the *global* generation batch (``generation_batch_size``
    rows: each question G times in a row), the same sequence on every process (same seed), and
    the dataloader is built with batches of ``per_device_train_batch_size * steps_per_generation``
    rows; accelerate (``split_batches=False``) then hands process ``p`` the ``p``-th of each run
    of ``num_processes`` consecutive batches. So process ``p``'s local row ``j`` is global row
    ``p * num_local + j``: one process with the whole batch holds the same rows in the same order.
    """
    return slice(process_index * num_local, (process_index + 1) * num_local)


def row_seed(seed: int, step: int, row: int) -> int:
    """The sampling seed of global row ``row`` of the generation batch of optimiser step ``step``
    (a 63-bit hash, so no two (step, row) pairs share a stream by arithmetic accident).

    Keyed by the global row (:func:`local_rows`), not by process, so that the same row is
    sampled alike whatever the number of processes; the G rows of a group differ by row."""
    return stream_seed("prorag-rl", int(seed), int(step), int(row))


def generation_row_seeds(seed: int, step: int, process_index: int, num_local: int) -> list[int]:
    """:func:`row_seed` of each of this process's ``num_local`` rows."""
    rows = local_rows(process_index, num_local)
    return [row_seed(seed, step, g) for g in range(rows.start, rows.stop)]


class EngineRollout:
    """TRL's ``rollout_func``: runs the rows of a generation batch through the rollout engine.

    Called as ``rollout(prompts, trainer)`` with the prompts of this process's rows (each
    question already repeated G times by TRL's sampler); the rows themselves come from
    ``trainer.generation_rows``. Returns the engine's ``prompt_ids``, ``completion_ids``,
    ``logprobs`` and ``env_mask`` (1 on tokens the policy wrote, 0 on the environment's), plus
    ``trajectory`` (the :class:`~prorag.agent.trajectory.Trajectory` of each row), which TRL forwards to
    the reward functions and merges into the rows. ``seconds`` holds the last call's duration.

    Each row samples from its own stream, seeded by (``config.seed``, optimiser step, the row's
    index in the step's *global* generation batch; :func:`generation_row_seeds`), so a row's
    trajectory does not depend on how the batch is split over processes or rollout batches.
    """

    def __init__(self, records: Sequence[Record], retriever: Retriever, config: RolloutConfig) -> None:
        self.records = list(records)
        self.retriever = retriever
        self.config = config
        self.seconds = 0.0
        self._engine: RolloutEngine | None = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        rows = getattr(trainer, "generation_rows", None)
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError("EngineRollout needs the trainer's generation_rows (use ProcessSupervisedGRPOTrainer)")
        records = [self.records[int(r["record_index"])] for r in rows]
        for p, rec in zip(prompts, records, strict=True):
            if p != rec.question:
                raise RuntimeError(f"prompt {p!r} does not match record {rec.id!r}")
        acc = trainer.accelerator
        seeds = generation_row_seeds(self.config.seed, trainer.state.global_step, acc.process_index, len(rows))
        start = time.perf_counter()
        if getattr(trainer, "use_vllm", False):
            with trl_engine_awake(trainer.vllm_generation):
                trajs = self._vllm_engine(trainer).rollout(records, row_seeds=seeds)
        else:
            with unwrap_model_for_generation(
                trainer.model_wrapped, acc, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
            ) as model:
                if self._engine is None or self._engine.model is not model or self._engine.config is not self.config:
                    # One engine per model, kept across steps: its decode graphs (CUDA) are captured once.
                    self._engine = RolloutEngine(model, trainer.processing_class, self.retriever, self.config)
                engine = self._engine
                trajs = engine.rollout(records, row_seeds=seeds)
        self.seconds = time.perf_counter() - start
        return {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.completion_ids for t in trajs],
            "logprobs": [t.logprobs for t in trajs],
            "env_mask": [t.env_mask for t in trajs],
            "trajectory": trajs,
        }

    def _vllm_engine(self, trainer: Any) -> RolloutEngine:
        """The rollout engine on the vLLM engine TRL owns, made once: the colocated ``LLM``, or the
        ``trl vllm-serve`` server (through TRL's client on the main process, a client of its own on
        the others: each process drives the server with its own rows)."""
        if self._engine is None:
            generation = trainer.vllm_generation
            policy = trainer.accelerator.unwrap_model(trainer.model)
            eos = getattr(policy, "generation_config", None)
            if generation.mode == "colocate":
                backend: Any = VLLMBackend(generation.llm, generation_config=eos)
            else:
                backend = VLLMServerBackend(server_client(generation), generation_config=eos)
            self._engine = RolloutEngine(policy, trainer.processing_class, self.retriever, self.config, backend=backend)
        return self._engine


def server_client(generation: Any) -> Any:
    """TRL's client of the vLLM server: the trainer's own (main process), else a new one on the same
    server (a client needs no weight-sync communicator to generate)."""
    client = getattr(generation, "vllm_client", None)
    if client is not None:
        return client
    from trl.generation.vllm_client import VLLMClient

    base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
    generation.vllm_client = VLLMClient(base_url=base_url, connection_timeout=generation.server_timeout)
    return generation.vllm_client


@contextlib.contextmanager
def trl_engine_awake(generation: Any) -> Iterator[None]:
    """TRL's colocated engine ready to generate for the duration, as TRL's own ``generate`` does it:
    under sleep mode, weights pushed back if they were discarded and the KV cache woken, then the
    engine put back to sleep (level 2) after. Nothing to do in server mode or without sleep mode."""
    sleeping = generation.mode == "colocate" and generation.enable_sleep_mode
    if sleeping:
        if getattr(generation, "_llm_weights_sleeping", False):
            generation.sync_weights()
        generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield
    finally:
        if sleeping:
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True


__all__ = [
    "EngineRollout",
    "generation_row_seeds",
    "local_rows",
    "row_seed",
    "server_client",
    "trl_engine_awake",
]
