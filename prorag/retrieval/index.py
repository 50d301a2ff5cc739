"""Index folders: build one from a corpus file, load one, or open any retriever by its spec.

An index folder holds ``passages.jsonl``, the files of its kind (``bm25.json`` and ``bm25/``,
or ``dense.json`` and ``embeddings.safetensors``, or for a FAISS file built elsewhere ``dense.json``,
``faiss.index`` and the passages' offsets) and the manifest ``index.json``, written
last: a folder without it is an index whose build was interrupted, and :func:`load_index`
refuses it instead of serving half an index. A build goes into ``OUT.tmp-XXXX`` beside the
index and replaces it by renames only once complete, so a build that fails (a bad corpus, a
kill) leaves the working index as it was. A killed build leaves its ``OUT.tmp-PID-*`` folder: the
next build of ``OUT`` removes it once that pid is no longer running, and says so.

The retriever modules are imported lazily, so that opening a BM25 index never imports torch.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import prorag
from prorag.core.errors import DataError
from prorag.data.jsonl import read_json, write_json
from prorag.data.records import Passage, read_passages
from prorag.retrieval.base import Retriever

MANIFEST = "index.json"
FORMAT_VERSION = 1
KINDS = ("bm25", "dense")
#: Between an index folder's name and the pid in the name of a build's temporary folder.
_TMP_INFIX = ".tmp-"

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def build_index(
    corpus_path: PathLike,
    out_dir: PathLike,
    *,
    kind: str = "bm25",
    model: str | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    batch_size: int = 64,
) -> dict[str, Any]:
    """Index the corpus JSONL at ``corpus_path`` into ``out_dir``; return the manifest written.

    ``model``, the prefixes and ``batch_size`` are dense settings; giving a model or a prefix
    to a BM25 build is an error rather than silently ignored.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "bm25" and (model or query_prefix or passage_prefix):
        raise ValueError("--model, --query-prefix and --passage-prefix only apply to dense indexes")
    passages = read_passages(corpus_path)
    if not passages:
        raise DataError(str(corpus_path), "the corpus has no passages")
    return _into_new_folder(
        Path(out_dir), lambda tmp: _build_into(passages, tmp, kind, model, query_prefix, passage_prefix, batch_size, corpus_path)
    )


def import_faiss_index(
    faiss_path: PathLike,
    corpus_path: PathLike,
    out_dir: PathLike,
    *,
    model: str | None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
) -> dict[str, Any]:
    """Make a dense index folder of a FAISS file built elsewhere and its corpus JSONL, without encoding
    the passages (:mod:`~prorag.retrieval.faiss_file`); return the manifest written. Prefixes left
    ``None`` are E5's for a model named ``*e5*``, else empty."""
    from prorag.retrieval.faiss_file import import_faiss

    def fill(tmp: Path) -> dict[str, Any]:
        start = time.perf_counter()
        retriever = import_faiss(
            faiss_path, corpus_path, tmp, model=model, query_prefix=query_prefix, passage_prefix=passage_prefix
        )
        return _write_manifest(tmp, "dense", retriever, start, corpus_path)

    return _into_new_folder(Path(out_dir), fill)


def _into_new_folder(out: Path, fill: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fill`` on a new folder beside ``out`` and swap it in once complete; return what ``fill`` returned."""
    started = time.time()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    removed = remove_stale_builds(out, started)
    if removed:
        log.warning("removed %d folder(s) left by killed builds of %s: %s", len(removed), out, ", ".join(p.name for p in removed))
    tmp = _new_build_dir(out)
    try:
        info = fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, out)
    return info


def _new_build_dir(out: Path) -> Path:
    """A new empty folder ``OUT.tmp-PID-XXXXXXXX`` beside ``out``, where a build writes: the pid
    tells a running build's folder from a killed one's (:func:`remove_stale_builds`). Created
    with the umask's permissions (usually 0755), unlike ``tempfile.mkdtemp``'s 0700, which would
    hide the index from a server run by another user."""
    for _ in range(100):
        tmp = out.parent / f"{out.name}{_TMP_INFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"cannot create a build folder beside {out}")


def remove_stale_builds(out: Path, started: float) -> list[Path]:
    """Remove the ``OUT.tmp-*`` folders that killed builds of ``out`` left beside it; return them.

    Only folders of ``out`` itself, and only those no build is using: one named with a pid
    (:func:`_new_build_dir`) is stale once no process of that pid runs on this machine; one without
    (left by an older version) once it was last changed before ``started``, this build's start.
    """
    removed = []
    prefix = out.name + _TMP_INFIX
    for path in sorted(out.parent.iterdir()):
        if not path.name.startswith(prefix) or path.is_symlink() or not path.is_dir():
            continue
        named = re.fullmatch(r"(\d+)-[0-9a-f]{8}", path.name[len(prefix) :])
        stale = not _running(int(named.group(1))) if named else path.stat().st_mtime < started
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (where that cannot be told: assumed so)."""
    if os.name != "posix" or pid <= 0:
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _check_replaceable(out: Path) -> None:
    """Refuse to build over a folder that is not an index (its files would be deleted by the swap):
    only a missing or empty folder, or one holding an index (complete or not), is replaced."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DataError(str(out), "exists and is not a folder; choose another --out")
    if any(out.iterdir()) and not ((out / MANIFEST).is_file() or (out / "passages.jsonl").is_file()):
        raise DataError(str(out), "is a non-empty folder that is not an index; refusing to replace it (choose another --out)")


def _swap_in(new: Path, out: Path) -> None:
    """Put the complete index ``new`` at ``out`` by renames: the old index is moved aside, the new
    one renamed in, then the old one deleted (a directory cannot be renamed over a non-empty one).
    Only a kill between the two renames leaves ``out`` missing, with the old index at ``OUT.old-*``."""
    if not out.exists():
        new.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
    out.rename(old / "index")
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _build_into(
    passages: list[Passage],
    out: Path,
    kind: str,
    model: str | None,
    query_prefix: str,
    passage_prefix: str,
    batch_size: int,
    corpus_path: PathLike,
) -> dict[str, Any]:
    """Index ``passages`` into the (new, empty) folder ``out``, manifest last; return the manifest."""
    start = time.perf_counter()
    retriever: Any
    if kind == "bm25":
        from prorag.retrieval.bm25 import BM25Retriever

        retriever = BM25Retriever(passages, source=str(corpus_path))
    else:
        from prorag.retrieval.dense import DenseRetriever

        retriever = DenseRetriever(
            passages, model=model, query_prefix=query_prefix, passage_prefix=passage_prefix, batch_size=batch_size
        )
    retriever.save(out)
    return _write_manifest(out, kind, retriever, start, corpus_path)


def _write_manifest(out: Path, kind: str, retriever: Any, start: float, corpus_path: PathLike) -> dict[str, Any]:
    """Write ``out``'s manifest, the last file of a build; return it."""
    info = {
        "kind": kind,
        "format_version": FORMAT_VERSION,
        "num_passages": retriever.num_passages,
        "num_partitions": len(retriever.partitions),
        "build_seconds": round(time.perf_counter() - start, 3),
        "corpus": str(corpus_path),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "prorag_version": prorag.__version__,
        "settings": retriever.settings(),
    }
    write_json(out / MANIFEST, info)
    return info


def read_manifest(index_dir: PathLike) -> dict[str, Any]:
    """The manifest of a complete index folder; a clear :class:`DataError` otherwise."""
    folder = Path(index_dir)
    if not folder.is_dir():
        raise DataError(str(folder), "no such index folder")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        if any(folder.iterdir()):
            raise DataError(
                str(folder),
                f"incomplete index: {MANIFEST} is missing, so its build was interrupted or is still "
                "running; rebuild it with `prorag index`",
            )
        raise DataError(str(folder), f"not an index folder (empty, no {MANIFEST}); build one with `prorag index`")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise DataError(str(manifest_path), "expected a JSON object")
    kind = manifest.get("kind")
    if kind not in KINDS:
        raise DataError(str(manifest_path), f"unknown index kind {kind!r}; expected one of {', '.join(KINDS)}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            str(manifest_path),
            f"index format version {manifest.get('format_version')!r}, this version reads {FORMAT_VERSION}: rebuild the index",
        )
    return manifest


def load_index(index_dir: PathLike) -> Retriever:
    """Load a complete index folder of any kind (see :func:`read_manifest` for the checks)."""
    manifest = read_manifest(index_dir)
    try:
        if manifest["kind"] == "bm25":
            from prorag.retrieval.bm25 import BM25Retriever

            return BM25Retriever.load(index_dir)
        if "faiss" in manifest.get("settings", {}):
            from prorag.retrieval.faiss_file import FaissFileRetriever

            return FaissFileRetriever.load(index_dir)
        from prorag.retrieval.dense import DenseRetriever

        return DenseRetriever.load(index_dir)
    except (FileNotFoundError, KeyError) as e:
        raise DataError(str(index_dir), f"corrupt {manifest['kind']} index ({e!r}); rebuild it") from None


def open_retriever(spec: str | PathLike) -> Retriever:
    """An ``http(s)://`` URL gives an :class:`~prorag.retrieval.client.HttpRetriever`; anything else is an index folder."""
    text = str(spec)
    if text.startswith(("http://", "https://")):
        from prorag.retrieval.client import HttpRetriever

        return HttpRetriever(text)
    return load_index(text)
