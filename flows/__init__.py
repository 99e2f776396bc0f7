"""gradebook: the Prefect flows (generate, score, rescore, sweep, serve, demo) and the CLI."""

import os as _os
import sys as _sys

# Prefect reads its settings when first imported, so this must run before any flow module
# imports it: a server on SQLite with telemetry on prints "database is locked" tracebacks.
_os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _record_loaded_code() -> None:
    # Every process that runs flows records the exact source of the project modules it imports
    # (scorers.identity.loaded_code), so a verifier graded here is fingerprinted as it was
    # imported, not as its file reads later. The recorder is loaded by path, as `boot_code()`
    # does for the grading workers, so that the `scorers` package is imported (and recorded) after it.
    import importlib.util

    name = "scorers.identity.loaded_code"
    module = _sys.modules.get(name)
    if module is None:
        root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
        path = _os.path.join(root, "scorers", "identity", "loaded_code.py")
        with open(path, "rb") as f:
            data = f.read()
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        _sys.modules[name] = module
        exec(compile(data, path, "exec"), module.__dict__)  # noqa: S102 - our own file
        # the package imported before the flows: not recorded, but usable
        if "scorers.identity" in _sys.modules:
            _sys.modules["scorers.identity"].loaded_code = module  # type: ignore[attr-defined]
        module.install(data)
    else:
        module.install()


_record_loaded_code()
