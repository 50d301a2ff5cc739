"""A method's settings travel with its registration: a config that selects methods of a registry
holds each registered method's settings as a nested field of its name, the moment the method
registers (before or after the config class exists), in YAML, ``--set``, ``--help``, dumps and
equality alike; help texts list the registry's names with their descriptions."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from prorag.core.config import apply_overrides, config_from_dict, field_help, method_settings, setting
from prorag.core.errors import DataError
from prorag.core.registry import Entry, Registry


@dataclass
class StepSettings:
    value: float = setting(1.0, help="The score of every step.")


@dataclass
class OtherSettings:
    k: int = setting(4, help="Samples.")


def selecting(registry: Registry) -> type:
    """A fresh config class whose ``reward`` field selects a method of ``registry``."""

    @method_settings(reward=registry)
    @dataclass
    class Trainer:
        reward: str = setting("plain", choices=registry, help="The reward, a name in REWARDS:")
        beta: float = setting(0.3, help="Weight.")

    return Trainer


def test_registration_keeps_a_settings_class_and_a_description() -> None:
    rewards: Registry = Registry("reward")
    rewards.register("plain", help="the outcome alone")(print)
    rewards.register("steps", config=StepSettings)(len)  # no help: the object's docstring's first paragraph
    assert rewards.entry("plain") == Entry(None, "the outcome alone")
    assert (
        rewards.entry("steps").config is StepSettings
        and rewards.entry("steps").help == "Return the number of items in a container."
    )
    assert rewards.describe() == "`plain`: the outcome alone; `steps`: Return the number of items in a container."
    seen: list[str] = []
    rewards.watch(lambda name, entry: seen.append(name))
    rewards.register("later", help="x")(abs)
    assert seen == ["plain", "steps", "later"]


def test_a_method_s_settings_are_a_nested_field_of_its_name_before_and_after_the_class() -> None:
    rewards: Registry = Registry("reward")
    rewards.register("plain", help="the outcome alone")(print)
    rewards.register("steps", config=StepSettings, help="a score per step")(len)
    Trainer = selecting(rewards)
    made_before = Trainer()
    rewards.register("sampled", config=OtherSettings, help="a sampled path")(abs)  # a plugin, registered later

    cfg = Trainer()
    assert cfg.steps == StepSettings() and cfg.sampled == OtherSettings() and made_before.sampled == OtherSettings()
    assert [f.name for f in dataclasses.fields(Trainer)] == ["reward", "beta", "steps", "sampled"]
    changed = apply_overrides(cfg, ["reward=steps", "steps.value=0.5", "sampled.k=2"])
    assert changed.steps.value == 0.5 and changed.sampled.k == 2 and changed != cfg
    assert changed == Trainer(reward="steps", steps=StepSettings(0.5), sampled=OtherSettings(2))
    assert "steps=StepSettings(value=0.5)" in repr(changed)
    data = json.loads(json.dumps(dataclasses.asdict(changed)))
    assert data == {"reward": "steps", "beta": 0.3, "steps": {"value": 0.5}, "sampled": {"k": 2}}
    assert config_from_dict(Trainer, data) == changed  # a saved config reads back
    assert dataclasses.replace(changed, beta=0.1).steps.value == 0.5

    with pytest.raises(DataError, match=r"field 'steps': expected a valid StepSettings .*value"):
        config_from_dict(Trainer, {"steps": {"value": "high"}})
    with pytest.raises(DataError, match="unknown key 'stesp' for Trainer; did you mean 'steps'"):
        apply_overrides(cfg, ["stesp.value=1"])

    rows = {name: (default, text) for name, _, default, text in field_help(Trainer)}
    assert rows["steps.value"] == ("1.0", "The score of every step.")
    assert rows["sampled"][1] == "Settings of `reward: sampled`: a sampled path."
    assert rows["reward"][1] == (
        "The reward, a name in REWARDS: `plain`: the outcome alone; `steps`: a score per step; `sampled`: a sampled path"
    )


def test_a_method_whose_settings_cannot_have_a_section_is_refused_at_registration() -> None:
    rewards: Registry = Registry("reward")
    selecting(rewards)
    with pytest.raises(TypeError, match="reward 'beta' has settings, but Trainer already has a field 'beta'"):
        rewards.register("beta", config=StepSettings)(len)
    with pytest.raises(TypeError, match="must be an identifier"):
        rewards.register("first-error", config=StepSettings)(abs)
    assert rewards.names() == []  # a refused method is not registered
    with pytest.raises(TypeError, match="has no field"):
        method_settings(missing=rewards)(StepSettings)
