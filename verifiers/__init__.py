"""gradebook: verifiers — what a verifier is named, specified, stored and rebuilt as.

A verifier reaches a command three ways: the user names it (a sweep config, `--verifier`,
`--verifier-module`), a log names it (gradebook's generate metadata or the log's own scorers),
or a warehouse stores its spec. This package resolves each into a registered verifier and says
which are current:

- `specs`          the verifiers that score a log (never importing a file a log names)
- `stored`         rebuilding a verifier from the spec a warehouse stores (the trust rule)
- `modules`        loading the user's verifier modules; how to load one a warehouse names
- `roles`          `--model-role`: the judge a command binds to a judge scorer's roles
- `nothing_to_do`  a command with nothing to do says so from the warehouse, cheaply
- `rescore_plan`   what a re-score would do (`--dry-run`)

What a verdict is fingerprinted with (the code and parameters that produced it) is
`scorers.identity`: a verifier is also an RL reward, fingerprinted in a trainer's process that
has no warehouse, so that half stays below the warehouse (docs/architecture.md).
"""
