"""An arms ablation's seeds spread over worker processes (``prorag ablate --workers N``).

Every arm and seed of ``--what process`` or ``family`` is an independent RL run and test evaluation,
each a stage of the run folder with its own marker; one after another they leave most of a machine
idle (a small model's ops do not fill many cores; one RL run uses one GPU). ``--workers N`` starts N
processes of :func:`~prorag.experiments.ablations.worker_main` on the same run folder: worker i runs
every arm of the seeds ``seeds[i::N]``, with ``cores // N`` torch threads and, where GPUs are visible,
one of them (``CUDA_VISIBLE_DEVICES``, dealt round-robin). By seed, not by run, because the arms of one
seed share a file (``rl/screening-rft-seedS.jsonl``, written by the first to run); every other file is
a run's own, so workers never write the same file. The parent then goes through the ablation as
without workers, only reading the evaluations; a killed ablation resumes where each run stopped.

On the CPU a run's floats can depend on its thread count (the order of sums), so an ablation repeats
exactly only at the same ``--workers`` on the same machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm.auto import tqdm

from prorag.experiments.pipeline import Run, rl_run_name, write_resolved_config

#: How often the parent looks at the workers and the finished runs, in seconds.
POLL_SECONDS = 2.0
#: Lines of a failed worker's log quoted in the error.
LOG_TAIL_LINES = 20


def seed_shards(seeds: Sequence[int], workers: int) -> list[list[int]]:
    """The seeds of each worker, dealt round-robin (``seeds[i::workers]``), so that workers get
    equal shares to within one seed; never more shards than seeds (a worker without a seed would
    start a process for nothing)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return [list(seeds[i::workers]) for i in range(min(workers, len(seeds)))]


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_gpus() -> int:
    """How many CUDA devices torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def worker_env(index: int, workers: int, env: Mapping[str, str], cores: int, gpus: int) -> dict[str, str]:
    """The environment of worker ``index`` of ``workers``: ``env`` with ``cores // workers`` threads
    (at least one) for OpenMP and MKL, unbuffered output for its log, and, when ``gpus`` are
    visible, one of them. The GPU is named in the parent's own numbering: an index into the
    parent's ``CUDA_VISIBLE_DEVICES`` when that is set, so a worker never sees a device the
    parent was not given."""
    threads = max(1, cores // workers)
    out = dict(env) | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    if gpus:
        given = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        devices = given or [str(i) for i in range(gpus)]
        out["CUDA_VISIBLE_DEVICES"] = devices[index % len(devices)]
    return out


#: The worker's entry point: :func:`prorag.experiments.ablations.worker_main` (named, not imported:
#: the ablations call this module, so importing them here would close a cycle).
WORKER_ENTRY = "from prorag.experiments.ablations import worker_main; worker_main()"


def worker_command(
    run_dir: Path, config_file: Path, what: str, seeds: Sequence[int], arms: Sequence[str] | None, threads: int
) -> list[str]:
    """The command line of one worker: the ablations' :data:`WORKER_ENTRY` under the parent's Python."""
    cmd = [sys.executable, "-c", WORKER_ENTRY, "--run-dir", str(run_dir), "--config", str(config_file)]
    cmd += ["--what", what, "--seeds", ",".join(str(s) for s in seeds), "--threads", str(threads)]
    return cmd + (["--arms", ",".join(arms)] if arms else [])


@dataclass
class Worker:
    """One started worker: its index, seeds, process and log file."""

    index: int
    seeds: list[int]
    process: subprocess.Popen[bytes]
    log: Path


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    # Progress bars rewrite one line with carriage returns; the last state of each is what counts.
    # (Text mode and ``str.splitlines`` would split at those too.)
    text = path.read_bytes().decode("utf-8", errors="replace") if path.exists() else ""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.rstrip("\n").split("\n")[-lines:])


def supervise(workers: Sequence[Worker], finished: Callable[[], int], total: int, poll_seconds: float = POLL_SECONDS) -> None:
    """Wait for every worker, with a progress bar over the ablation's ``total`` runs (``finished()``
    counts those done). A failed worker does not stop the others: what they finish is kept and a
    rerun skips it. Once all have exited, a failure raises an error naming each failed worker, its
    exit code, its log and the log's last lines. An interrupt (Ctrl-C) terminates the workers;
    their runs resume from their last checkpoints."""
    bar = tqdm(total=total, initial=finished(), desc="ablation runs", unit="run")
    try:
        while any(w.process.poll() is None for w in workers):
            time.sleep(poll_seconds)
            bar.update(finished() - bar.n)
        bar.update(finished() - bar.n)
    except BaseException:
        for w in workers:
            if w.process.poll() is None:
                w.process.terminate()
        for w in workers:
            w.process.wait()
        raise
    finally:
        bar.close()
    failed = [w for w in workers if w.process.returncode != 0]
    if failed:
        raise RuntimeError(
            "\n".join(
                f"worker {w.index} (seeds {', '.join(map(str, w.seeds))}) exited with code {w.process.returncode}; "
                f"its log {w.log} ends with:\n{_log_tail(w.log)}"
                for w in failed
            )
            + "\nThe runs that finished are kept: run the same command again to resume."
        )


def run_in_workers(
    run: Run,
    what: str,
    seeds: Sequence[int],
    arms: Sequence[str],
    workers: int,
    progress: Callable[[str], None] = print,
) -> None:
    """Train and evaluate every run of the ``what`` ablation (its ``arms``, already selected, and
    ``seeds``) in up to ``workers`` processes (:func:`seed_shards`, :func:`worker_env`), and wait
    for them (:func:`supervise`).
    The workers read the run's resolved config from ``RUN/ablations/workers/WHAT_config.yaml`` and
    log to ``RUN/ablations/workers/WHAT-workerI.log`` (appended to, so a resumed ablation keeps the
    first attempt's log)."""
    folder = run.path("ablations", "workers")
    config_file = folder / f"{what}_config.yaml"
    write_resolved_config(run.config, config_file)
    markers = [run.path("stages", f"eval-{rl_run_name(arm, seed)}.json") for arm in arms for seed in seeds]
    shards = seed_shards(seeds, workers)
    cores, gpus = available_cores(), visible_gpus()
    started: list[Worker] = []
    logs: list[IO[bytes]] = []
    try:
        for i, shard in enumerate(shards):
            env = worker_env(i, len(shards), os.environ, cores, gpus)
            log = folder / f"{what}-worker{i}.log"
            logs.append(log.open("ab"))
            cmd = worker_command(run.dir, config_file, what, shard, arms, int(env["OMP_NUM_THREADS"]))
            started.append(Worker(i, shard, subprocess.Popen(cmd, stdout=logs[-1], stderr=subprocess.STDOUT, env=env), log))
            gpu = f", GPU {env['CUDA_VISIBLE_DEVICES']}" if gpus else ""
            progress(f"worker {i}: seeds {', '.join(map(str, shard))}, {env['OMP_NUM_THREADS']} threads{gpu} -> {log}")
        supervise(started, lambda: sum(m.exists() for m in markers), len(markers))
    finally:
        for w in started:
            if w.process.poll() is None:
                w.process.terminate()
                w.process.wait()
        for f in logs:
            f.close()


__all__ = [
    "WORKER_ENTRY",
    "Worker",
    "available_cores",
    "run_in_workers",
    "seed_shards",
    "supervise",
    "visible_gpus",
    "worker_command",
    "worker_env",
]
