"""A verifier's identity: which exact code and parameters produced a verdict.

- `fingerprint`: `fingerprint(verifier)`, `fingerprint_as_loaded(verifier)` and
  `VerifierFingerprint`, the digest the warehouse keys every score by;
- `cache`: the on-disk cache of per-module fingerprint work;
- `loaded_code`: the recorder of the bytes every project module was compiled from in this
  process and its helpers. It is loaded by file path before `scorers` exists (flows/__init__.py,
  `boot_code()`), so this package imports nothing.
"""
