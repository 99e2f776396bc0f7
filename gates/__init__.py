"""gradebook: gates — release gates, from the pure rules to the decision recorded.

Layered inside the package, each module's name says its layer:

- `rules` (pure): the gate rules of a sweep config (thresholds for accuracy, errored and
  unscored samples) and their evaluation on a run's numbers;
- `stats` (pure): the statistics a regression rule decides with (McNemar's exact test,
  Newcombe's interval of a paired difference);
- `records` (warehouse I/O): read a run's numbers, decide with `rules`, record the decision;
- `evaluate` (the command's function): the gates of runs under the current verifier
  fingerprints, as `gradebook gate` and the gate stage call it (no Prefect).

The Prefect task and flow are `flows.gate_stage`; the command is `flows.cli.gate`; the
`gates` table's schema is `warehouse.gate_schema` (the warehouse's migrations own it).
"""
