"""The one safetensors loader: a damaged file is a ``DataError`` naming it and saying what to do,
found from its header and size before the library reads it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from prorag.core.errors import DataError
from prorag.data.safetensors_files import check_folder, damage, folder_damage, load_numpy, load_torch


def write_tensors(path: Path) -> Path:
    safetensors.numpy.save_file({"a": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.ones(4, np.int64)}, str(path))
    return path


def cut(path: Path, keep: int | None = None) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])
    return path


def test_a_sound_file_loads_with_either_library(tmp_path: Path) -> None:
    path = write_tensors(tmp_path / "w.safetensors")
    assert damage(path) is None
    assert load_numpy(path)["a"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert load_torch(path)["b"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: cut(write_tensors(p), keep=170), "the header needs 56 bytes of tensor data, the file holds 50"),
        (lambda p: cut(write_tensors(p), keep=60), "does not fit in the file's 60 bytes"),
        (lambda p: cut(write_tensors(p), keep=5), "5 bytes, shorter than the 8-byte header length"),
        (lambda p: p.write_bytes(b"garbage! not a safetensors file at all"), "does not fit in the file's"),
        (lambda p: p.write_bytes(struct.pack("<Q", 4) + b"[1] "), "the header is not a JSON object"),
        (lambda p: p.write_bytes(struct.pack("<Q", 4) + b"{1: "), "the header is not JSON"),
        (lambda p: p.write_bytes(write_tensors(p).read_bytes() + b"extra"), "the file holds 61"),
        (
            lambda p: p.write_bytes(_with_header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4)),
            "tensor 'x' spans 4 bytes, its dtype and shape need 8",
        ),
        (
            lambda p: p.write_bytes(_with_header({"x": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, 4)),
            "tensor 'x' starts at byte 2 of the data, expected 0",
        ),
    ],
)
def test_a_damaged_file_names_itself_and_what_to_do(tmp_path: Path, make, expected: str) -> None:
    path = tmp_path / "w.safetensors"
    make(path)
    assert expected in (damage(path) or "")
    with pytest.raises(DataError) as e:
        load_numpy(path, remedy="rebuild it")
    message = str(e.value)
    assert message.startswith(f"{path}: damaged safetensors file: ") and expected in message
    assert message.endswith("; rebuild it") and "\n" not in message
    with pytest.raises(DataError, match="damaged safetensors file"):
        load_torch(path)


def _with_header(header: dict, data_bytes: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"gone\.safetensors: damaged safetensors file: no such file"):
        load_numpy(tmp_path / "gone.safetensors")


def test_a_folder_names_its_damaged_weights_file_and_missing_shards(tmp_path: Path) -> None:
    check_folder(tmp_path / "not-a-folder")  # a hub id: nothing to check
    write_tensors(tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    assert folder_damage(tmp_path) == "model-00002-of-00002.safetensors: no such file"
    write_tensors(tmp_path / "model-00002-of-00002.safetensors")
    assert folder_damage(tmp_path) is None
    check_folder(tmp_path)
    cut(tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(DataError) as e:
        check_folder(tmp_path, remedy="restore the checkpoint")
    assert str(e.value).startswith(f"{tmp_path / 'model-00002-of-00002.safetensors'}: damaged safetensors file: header length")
    assert str(e.value).endswith("; restore the checkpoint")
