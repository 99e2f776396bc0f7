"""Process machinery for verifier code that must be killable: bounded worker pools and zygotes.

- `bounded`: `shared_pool(preload)`, a pool of worker processes with a hard deadline per call
  (the math verifier's sympy comparisons run there, so no input can hold a caller);
- `zygote`: the fork server those workers come from, a fresh interpreter that imports the heavy
  modules once, records their source (`scorers.identity.loaded_code`) and forks per worker.
"""
