"""Names a package exports but imports only on first use, so importing the package stays fast.

Example:
    >>> import sys, types
    >>> pkg = types.ModuleType("pkg_demo")
    >>> pkg.__all__ = ["sqrt"]
    >>> sys.modules["pkg_demo"] = pkg
    >>> pkg.__getattr__, pkg.__dir__ = lazy_exports("pkg_demo", {"sqrt": "math"})
    >>> pkg.sqrt(4.0)
    2.0
    >>> "sqrt" in vars(pkg)  # imported once, then an ordinary attribute
    True
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    module_name: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module ``module_name``: a name in ``where``
    (public name -> the module it lives in) is imported from its module on first use and kept
    in ``module_name``'s globals; ``dir()`` lists the globals and ``__all__``."""

    def __getattr__(name: str) -> Any:
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        module = sys.modules[module_name]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __getattr__, __dir__
