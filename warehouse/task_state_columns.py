"""What a `TaskState` rebuilt for an Inspect scorer needs, and where a verifier came from
(migration 10).

Why: Inspect scorers read more of a sample than gradebook's own verifiers do. `choice()` reads
the sample's `choices`, others read the transcript's messages as Inspect's `ChatMessage`s (the
`messages` table keeps their text only), and `choice()` needs the marks the `multiple_choice`
solver put on the choices, which a log does not keep: they are rebuilt from the saved output
the way that solver parses it, which needs the run's solver plan and its options.

- `samples.choices`: the sample's choices (NULL: it has none).
- `samples.messages_json`: the transcript's messages as Inspect serialises them (NULL for
  samples stored before this migration: an Inspect scorer leaves those unscored with reason
  `state_not_stored`).
- `samples.sample_id_is_int`: the sample id was an integer in the log (`sample_id` is text;
  a scorer sees the id as Inspect gave it).
- `runs.plan`: the log's solver plan (steps with their params).
- `run_sandbox` in the state (no column: read from `runs.eval_spec`): the run's sandbox as
  the log names it (`eval.sandbox`: type and config file) and its task file, for a sample whose
  log has no workspace record (a log from elsewhere: workspaces.foreign_image); NULL when the
  run named no sandbox.
- `verifiers.spec`: how to resolve that verifier again (an Inspect scorer's registry name and
  params, or its file; `recorded` for scores a log held). Read to re-resolve built-in and
  installed-package scorers by name; a file it names is only shown, never imported.
"""

from __future__ import annotations

TASK_STATE_SQL = """
ALTER TABLE wh.samples ADD COLUMN choices VARCHAR[];
ALTER TABLE wh.samples ADD COLUMN messages_json JSON;
ALTER TABLE wh.samples ADD COLUMN sample_id_is_int BOOLEAN;
ALTER TABLE wh.runs ADD COLUMN plan JSON;
ALTER TABLE wh.verifiers ADD COLUMN spec JSON;

-- the views list their tables' columns as they were when they were created
CREATE OR REPLACE VIEW runs AS SELECT * FROM wh.runs;
CREATE OR REPLACE VIEW samples AS
SELECT s.*, r.task, r.model
FROM wh.samples s LEFT JOIN wh.runs r USING (run_id);
CREATE OR REPLACE VIEW verifiers AS SELECT * FROM wh.verifiers;
"""

# What samples_to_score hands a verifier that rebuilds a TaskState (`Verifier.reads_state`),
# one JSON document per sample (s: wh.samples, r: wh.runs)
STATE_JSON_SQL = """json_object(
    'input', s.input, 'choices', s.choices, 'messages', s.messages_json, 'output', s.output,
    'store', s.store, 'uuid', s.uuid, 'epoch', s.epoch, 'n_messages', s.n_messages,
    'id_is_int', s.sample_id_is_int,
    'model', r.model, 'plan', r.plan, 'run_sandbox', r.run_sandbox
)::VARCHAR"""

# The runs STATE_JSON_SQL reads as `r`: each run's sandbox is read out of its eval spec here,
# once per run, not once per sample (each read parses the whole spec).
STATE_RUNS_SQL = """(
    SELECT run_id, model, plan,
           CASE WHEN json_extract(eval_spec, '$.sandbox') IS NOT NULL THEN json_object(
               'eval_sandbox', json_extract(eval_spec, '$.sandbox'),
               'task_file', json_extract_string(eval_spec, '$.task_file')) END AS run_sandbox
    FROM wh.runs
)"""
