"""Agent workspaces: captured at generation, restored into a fresh container at scoring.

A scorer that calls Inspect's `sandbox()` (it runs the agent's tests, reads the files it
wrote) needs the sandbox as the agent left it. This package keeps that workspace beside the
logs and gives it back to the scorer in the scoring stage, with zero model calls
(docs/concepts/workspaces.md). Modules, imported directly (this package re-exports nothing, so
that a grading worker loads only what it uses):

- `archive`: canonical, bounded tar archives made from hostile input, and the in-container
  extractor;
- `store`: the content-addressed store (sha256, zstd, written once);
- `record`: what a sample's log records of its sandboxes (in the sample's store);
- `capture`: the task cleanup that archives each sandbox at the end of a sample's generation;
- `restore`: the sample's sandboxes at scoring, restored on first use, removed at its end;
- `evidence`: every sandbox call a scorer makes, kept with its score.

Layering: below the flows (which call `capture` and `restore`), above `scorers.sandbox` (whose
containers it runs); `scorers` and `warehouse` never import it.
"""
