"""The Docker sandbox: where model-written code runs, and only there.

Public API (import from here): `SandboxPool`, `SandboxLimits`, `SandboxUnavailable`,
`reap_orphans`, `default_pool`, `close_default_pool`, `sandbox_down`. Modules:

- `pool`: the locked-down containers (no network, read-only root, caps, two uids) and the pool
  of warm ones the code verifier runs tests in;
- `_harness`: the trusted test harness shipped into each container; its verdict is the only one
  counted (docs/design/sandbox.md has the threat model);
- `image`: the sandbox image's tag and build (`gradebook sandbox build`);
- `provider`: the same containers as an Inspect sandbox provider ("gradebook") for generation.
"""

from scorers.sandbox.pool import (
    SandboxLimits,
    SandboxPool,
    SandboxUnavailable,
    close_default_pool,
    default_pool,
    reap_orphans,
    sandbox_down,
)

__all__ = [
    "SandboxLimits",
    "SandboxPool",
    "SandboxUnavailable",
    "close_default_pool",
    "default_pool",
    "reap_orphans",
    "sandbox_down",
]
