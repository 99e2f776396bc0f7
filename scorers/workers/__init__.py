"""The grading engine: the worker processes verifier code runs in, and the pools that drive them.

- `zygote`: the fork server workers come from, a fresh interpreter that imports the heavy
  modules once, records their source (`scorers.identity.loaded_code`) and forks per worker;
- `bounded`: `shared_pool(preload)`, a pool of worker processes with a hard deadline per call
  (the math verifier's sympy comparisons run there, so no input can hold a caller; an RL
  reward uses it in a trainer's process);
- `pool`: `GradingPool`, the scoring stage's workers: chunks of samples in, one result per
  sample out, only results of the code the caller expects; `worker`: what runs in one
  (`grade_chunk`: per-sample fault isolation and time limit; the worker's main loop);
- `stage`: a stage's use of the pool (`stream_grades`, `grade_batch`, the chunking);
- `async_grading`: the event loop in a worker that grades async scorers (Inspect scorers,
  judges) concurrently, with each sample's sandboxes restored;
- `prewarm`: the warm process a command boots before it knows its chunks, and what it preloads;
- `stop`: the process-wide stop request the pools poll.

Nothing here imports Prefect, a flow or the warehouse: the flows drive the engine, and a
trainer's process runs its `bounded` half alone.
"""
