"""``prorag[vllm]`` resolves beside every vLLM release it allows, and the CPU install keeps its exact pins.

The check runs over the recorded requirements in ``data/vllm_requires.json`` (each release's wheel
metadata and TRL 1.16.0's), never over the network. Two sets of requirements resolve together when,
for every package both name, some version satisfies every specifier set: a witness is looked for
among the versions the sets name and their next patch and minor releases (``!=5.5.0`` is passed by
5.5.1). Markers are evaluated for Linux x86_64, the platform vLLM's wheels are for.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).parent / "data" / "vllm_requires.json").read_text(encoding="utf-8"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
#: The Pythons a GPU user may install prorag[vllm] on (prorag needs >= 3.11).
TARGET_PYTHONS = ("3.11", "3.12", "3.13")
#: The CPU install's exact pins (README and .ci/run): the CPU torch build on disk, the TRL the trainers subclass.
CPU_PINS = {"torch": "2.13.0", "trl": "1.16.0"}

Requirements = dict[str, list[SpecifierSet]]


def _environment(python: str, extra: str = "") -> dict[str, str]:
    env = default_environment()
    env.update(
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        extra=extra,
    )
    return env


def requirements(lines: Iterable[str], python: str, extras: Iterable[str] = ()) -> list[Requirement]:
    """The requirements of ``lines`` that apply on Linux x86_64 with ``python`` and the ``extras`` asked for."""
    wanted = ("", *extras)
    out = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate(_environment(python, e)) for e in wanted):
            out.append(req)
    return out


def collect(
    reqs: Iterable[Requirement], published: Mapping[str, list[str]], python: str, into: Requirements | None = None
) -> Requirements:
    """Every package's specifier sets, following the extras of the packages in ``published`` (one level
    per call: ``trl[vllm]`` adds TRL's own requirements and those of its ``vllm`` extra)."""
    into = {} if into is None else into
    for req in reqs:
        name = canonicalize_name(req.name)
        into.setdefault(name, []).append(req.specifier)
        if name in published:
            collect(requirements(published[name], python, req.extras), {}, python, into)
    return into


def _candidates(specs: Iterable[SpecifierSet]) -> set[Version]:
    """The versions the specifier sets name, and for each its next patch and minor release."""
    out = set()
    for spec in specs:
        for s in spec:
            try:
                v = Version(s.version.removesuffix(".*"))
            except InvalidVersion:
                continue
            release = (*v.release, 0, 0)[:3]
            out |= {v, Version(f"{release[0]}.{release[1]}.{release[2] + 1}"), Version(f"{release[0]}.{release[1] + 1}.0")}
    return out


def conflicts(*sides: Requirements) -> list[str]:
    """Each package, over all ``sides``, for which no version satisfies every specifier set given for it."""
    found = []
    for name in sorted(set().union(*sides)):
        specs = [s for side in sides for s in side.get(name, []) if len(s)]
        if len(specs) < 2:
            continue
        if not any(all(s.contains(v, prereleases=True) for s in specs) for v in _candidates(specs)):
            found.append(f"{name}: {' and '.join(str(s) for s in specs)}")
    return found


def prorag_with_vllm(python: str, dependencies: list[str] | None = None) -> Requirements:
    """``prorag[vllm]``'s requirements (TRL's own and its ``vllm`` extra's included), from pyproject.toml."""
    lines = [*(PROJECT["dependencies"] if dependencies is None else dependencies), *PROJECT["optional-dependencies"]["vllm"]]
    published = {"trl": RECORDED["trl"]["requires_dist"]}
    return collect(requirements(lines, python), published, python)


def vllm_release(version: str, python: str) -> Requirements:
    return collect(requirements(RECORDED["vllm"][version]["requires_dist"], python), {}, python)


def _joined(specs: Iterable[SpecifierSet]) -> SpecifierSet:
    joined = SpecifierSet()
    for s in specs:
        joined &= s
    return joined


# ----------------------------------------------------------------------------- the extra


def test_the_extra_allows_exactly_the_recorded_releases_and_trl_allows_them_too() -> None:
    ours = _joined(Requirement(r).specifier for r in PROJECT["optional-dependencies"]["vllm"] if Requirement(r).name == "vllm")
    trl = _joined(r.specifier for r in requirements(RECORDED["trl"]["requires_dist"], "3.11", ["vllm"]) if r.name == "vllm")
    recorded = sorted(map(Version, RECORDED["vllm"]))
    assert recorded and all(ours.contains(v) and trl.contains(v) for v in recorded)
    bounds = {Version(s.version) for s in ours if s.operator in (">=", "<=", "==")}
    assert bounds <= set(recorded), f"record the requirements of {sorted(bounds - set(recorded))} in data/vllm_requires.json"


@pytest.mark.parametrize("version", sorted(RECORDED["vllm"], key=Version))
def test_prorag_vllm_resolves_beside_the_release(version: str) -> None:
    pythons = (
        {"python": [SpecifierSet(PROJECT["requires-python"])]},
        {"python": [SpecifierSet(RECORDED["vllm"][version]["requires_python"])]},
    )
    assert conflicts(*pythons) == []
    for python in TARGET_PYTHONS:
        ours = prorag_with_vllm(python)
        assert _joined(ours["vllm"]).contains(version)
        assert conflicts(ours, vllm_release(version, python)) == [], f"vllm {version}, Python {python}"
        assert not conflicts(ours), "prorag[vllm]'s own requirements (TRL's included) disagree"


def test_an_exact_torch_pin_in_the_metadata_would_be_caught() -> None:
    """The failure this test exists for: prorag pinning torch==2.13.0 while vLLM 0.22-0.26 pin 2.11.0."""
    pinned = [("torch==2.13.0" if Requirement(r).name == "torch" else r) for r in PROJECT["dependencies"]]
    broken = {v: conflicts(prorag_with_vllm("3.11", pinned), vllm_release(v, "3.11")) for v in RECORDED["vllm"]}
    broken = {v: found for v, found in broken.items() if found}
    assert broken and all(
        Version(v) < Version("0.27") and found == ["torch: ==2.13.0 and ==2.11.0"] for v, found in broken.items()
    )
    assert conflicts({"torch": [SpecifierSet("==2.13.0")]}, {"torch": [SpecifierSet("==2.9.0")]}) == [
        "torch: ==2.13.0 and ==2.9.0"
    ]
    assert conflicts({"transformers": [SpecifierSet(">=5.0")]}, {"transformers": [SpecifierSet("!=5.0.*,!=5.5.0,>=4.56")]}) == []


# ----------------------------------------------------------------------------- the CPU install


def _readme_install_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install and test", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's 'Install and test' has no bash block"
    return block.group(1).strip().splitlines()[0]


def test_the_readme_and_ci_install_the_same_exact_cpu_pins() -> None:
    command = _readme_install_command()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci, ".ci/run must run the README's install command word for word"
    words = shlex.split(command)
    for name, version in CPU_PINS.items():
        assert f"{name}=={version}" in words, f"the install command must pin {name}=={version}"


def test_the_metadata_holds_ranges_that_admit_the_cpu_pins() -> None:
    deps = {canonicalize_name(Requirement(r).name): Requirement(r).specifier for r in PROJECT["dependencies"]}
    for name, version in CPU_PINS.items():
        assert not any(s.operator in ("==", "===") for s in deps[name]), f"pyproject.toml pins {name}: put the pin in the README"
        assert deps[name].contains(version), f"pyproject.toml's {name}{deps[name]} excludes the CPU pin {version}"
