"""Every speed benchmark names the machine its ratio was measured on (`benchmarks/machine.py`)."""

from __future__ import annotations

import sys

import pytest

from tests.benchmarks.test_scripts import BENCHMARKS


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the benchmarks' machine module
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("machine", None)
    import machine

    return machine


def test_the_cpu_is_named_by_the_first_processors_model_name(machine) -> None:  # noqa: ANN001
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n\nprocessor\t: 1\nmodel name\t: Other\n"
    assert machine.cpu_name(cpuinfo) == "AMD EPYC 9654"
    assert machine.cpu_name("processor\t: 0\n")  # no model name: the platform's processor name, never empty
    name = machine.machine_name("cpu")
    assert name.startswith(machine.cpu_name()) and " cores, " in name


def test_every_benchmark_prints_the_machine_it_ran_on() -> None:
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "machine.py")
    assert scripts, BENCHMARKS
    silent = [p.name for p in scripts if "machine_name(" not in p.read_text() and "cpu_name(" not in p.read_text()]
    assert not silent, f"benchmarks that do not name their machine: {silent}"
