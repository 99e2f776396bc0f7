"""Inspect entry point: importing this module registers gradebook's extensions.

The "gradebook" sandbox provider, and gradebook's own Inspect scorers (the bundled tasks'), so
that a log naming one (`math_verifier`) resolves by registry name in any process, as an
installed package's scorer does (scorers.inspect_scorers.installed). They are imported by name:
`tasks.agentic_scorer` lives above `scorers`, and this module is the distribution's one
registration point, not a dependency of the scorers package.
"""

import importlib

from scorers.inspect_scorers.installed import OWN_SCORER_MODULES
from scorers.sandbox import provider  # noqa: F401  (registers the "gradebook" sandbox provider)

for _module in OWN_SCORER_MODULES:
    importlib.import_module(_module)
