"""Release gates as pure functions: no I/O, no database, so they are tested in milliseconds.

- `rules`: the gate rules of a sweep config (thresholds for accuracy, errored and unscored
  samples) and their evaluation on a run's numbers;
- `stats`: the statistics a regression rule decides with (McNemar's exact test, Newcombe's
  interval of a paired difference).

`warehouse.gates` reads the numbers from the warehouse and records each decision;
`flows.gate` is the gate stage.
"""
