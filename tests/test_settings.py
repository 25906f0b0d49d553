"""One settings base, each ``CSTACK_`` variable declared once.

Every package's settings class inherits ``serving.settings.CstackSettings``; a variable
two packages read is declared on the base, never again. Reading the classes' own
annotations (not the inherited ones) finds a second declaration wherever it hides.
"""

from __future__ import annotations

import collections
import importlib
import inspect

from pydantic_settings import BaseSettings

from serving.settings import CstackSettings
from tests.test_import_cycles import project_modules


def _settings_classes() -> list[type[BaseSettings]]:
    found = []
    for module in project_modules():
        if not module.endswith("settings"):
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if issubclass(cls, BaseSettings) and cls.__module__ == module:
                found.append(cls)
    return found


def test_every_settings_class_inherits_the_base() -> None:
    classes = _settings_classes()
    assert len(classes) >= 5
    assert all(issubclass(cls, CstackSettings) for cls in classes), classes


def test_each_variable_is_declared_once() -> None:
    owners = collections.defaultdict(list)
    for cls in _settings_classes():
        for name in vars(cls).get("__annotations__", {}):
            owners[name].append(cls.__qualname__)
    twice = {name: where for name, where in owners.items() if len(where) > 1}
    assert not twice, twice


def test_the_base_declares_what_several_packages_read() -> None:
    assert {"redis_url", "host", "state_dir", "vllm_start_timeout_s"} <= set(
        CstackSettings.model_fields
    )
