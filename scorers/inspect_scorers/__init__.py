"""Inspect scorers as gradebook verifiers.

`specs` (parse a `verifiers` entry, resolve it safely into a registered Verifier), `factories`
(find the @scorer factory a spec names), `task_state` (rebuild the TaskState from the
warehouse), `grading` (what a scoring worker runs). This package imports nothing itself: a
grading module's fingerprint covers the modules it imports, and a re-exporting `__init__` would
put all of them (and the warehouse that `specs` names verifiers with) into every scorer's.
"""
