"""Start pytest in a sandbox with the runner loaded before any episode code is findable.

Run as ``python -I -S pytest_bootstrap.py SITE PATHS [--plugin NAME=FILE]... -- ARGS``
inside ``training.rl.agent.isolation``'s sandbox. ``-I -S`` leave only the standard library
on the module path: no working directory, no ``PYTHONPATH``, no site-packages and so no
``.pth`` hooks. The bootstrap then

1. adds ``SITE`` (the allowed distributions, ``training.rl.agent.runtime``) and imports
   pytest, every module of ``_pytest``, pluggy, iniconfig and packaging;
2. loads each ``--plugin`` from its file under the name given (the scoring run's
   reporter), so ``-p NAME`` finds it already imported;
3. only then appends the repository's source roots ``PATHS`` (colon-separated), after the
   standard library and the runner, and runs ``pytest.main(ARGS)``.

So no file the episode writes can stand in for the runner, its plugins, the reporter or a
standard-library module: each is either imported already or found earlier on the path.
The command passes ``--import-mode=append`` so pytest's own additions to the path (test
folders) also go after them. Code the tests import still runs inside this process and can
patch what is loaded; that is the reward-hack monitor's to flag (``training.rl.monitor``).

Standalone on purpose: the sandbox sees this file, not the project.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import sys

#: The runner's packages, imported whole before any repository path is added.
RUNNER_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging")


def _import_whole(package: str) -> None:
    __import__(package)
    module = sys.modules[package]
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{package}."):
        try:
            __import__(info.name)
        except Exception:  # optional parts whose own dependencies are absent
            continue


def _load_plugin(name: str, path: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"pytest_bootstrap: cannot load plugin {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 3:
        raise SystemExit("usage: pytest_bootstrap.py SITE PATHS [--plugin NAME=FILE]... -- ARGS")
    split = argv.index("--")
    site, paths, options, args = argv[0], argv[1], argv[2:split], argv[split + 1 :]
    sys.path.append(site)
    for package in RUNNER_PACKAGES:
        _import_whole(package)
    if len(options) % 2:
        raise SystemExit(f"pytest_bootstrap: {options[-1]!r} has no value")
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag != "--plugin" or "=" not in value:
            raise SystemExit(f"pytest_bootstrap: bad option {flag!r} {value!r}")
        _load_plugin(*value.split("=", 1))
    sys.path.extend(path for path in paths.split(":") if path)
    import pytest

    return int(pytest.main(args))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
