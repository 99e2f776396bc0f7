"""Re-exports kept for one release where a documented import path moved (issue 36's house move).

Each old module imports its new one, warns once with a DeprecationWarning naming the new path,
and re-exports the new module's public names (`__all__`), so existing code keeps working.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def reexport(old: str, new: str, namespace: dict[str, Any]) -> None:
    """Fill `namespace` (the old module's globals) with the public names of `new`."""
    warnings.warn(
        f"{old} moved to {new}; import it from there ({old} goes away in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)
    names = list(getattr(module, "__all__", ()))
    namespace.update({name: getattr(module, name) for name in names})
    namespace["__all__"] = names
