"""A study's results file: its body under a front matter that says when, where and from what code.

The machine is named by the first processor's model, family, model number, stepping and AVX-512,
not by its model name alone: two CPUs that share a name gave other floats from the same config and
seed, so the name does not say where a build reproduces. The library versions are read from the
installed distributions, since pip resolves them afresh at every install.
"""

from __future__ import annotations

import datetime
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from prorag.data.jsonl import write_json


def git_head() -> str:
    """The short commit of the checkout this module sits in (``unknown`` outside a git checkout)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def write_results(out: Path, body: dict[str, Any], **front: Any) -> None:
    """Write a study's results file: the date, ``front`` (e.g. ``what``), the machine, the code's
    commit and the command that ran, then ``body``."""
    write_json(
        out,
        {
            "date": datetime.date.today().isoformat(),
            **front,
            "machine": f"{cpu_model()}, {platform.system()}",
            "libraries": library_versions(),
            "code": git_head(),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            **body,
        },
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU as ``/proc/cpuinfo`` names it, with its family, model and stepping and whether it has
    AVX-512. ``cpuinfo``: that file's text (read when not given)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return platform.processor() or platform.machine()
        cpuinfo = path.read_text()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    ident = [f"{key} {fields[key]}" for key in ("cpu family", "model", "stepping") if key in fields]
    if "flags" in fields:
        ident.append("AVX-512" if "avx512f" in fields["flags"].split() else "no AVX-512")
    return f"{name} ({', '.join(ident)})" if ident else name


def library_versions(names: tuple[str, ...] = ("torch", "transformers", "trl", "accelerate", "peft")) -> str:
    """The installed versions of the libraries a build's floats depend on, e.g. ``torch 2.13.0+cpu``."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)
