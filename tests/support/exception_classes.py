"""Every exception class a package defines: what tests/unit/test_errors.py (offtake) and
tests/operator/test_operator_errors.py (offtake_operator) hold to their package's root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType


def exception_classes(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every exception class defined (not imported) in a module of ``package``, by its
    qualified name. A ``__main__`` module is not imported: it runs its program."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found
