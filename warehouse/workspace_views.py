"""The `workspaces` and `sandbox_calls` views: agents' sandbox workspaces and scorers' sandbox
calls, read from what the warehouse already keeps (docs/reference/warehouse.md).

Why views and no tables: what a sample's sandboxes held at the end of its generation is in its
log, in the sample's Inspect store (`gradebook_workspace`, written there by
workspaces.capture), which ingest keeps in `samples.store`; and the sandbox calls a scorer made
are its score's evidence, in `scores.metadata.sandbox` (workspaces.evidence). Reading them
where they are means no second copy to keep consistent under kill -9, and a log from an older
warehouse shows its workspaces as soon as it is ingested. Logs are hostile input: every field
is read with TRY_CAST, so a malformed record reads as NULLs and never breaks a query.
"""

from __future__ import annotations

WORKSPACE_VIEWS_SQL = """
CREATE OR REPLACE VIEW workspaces AS
WITH boxes AS (
    SELECT s.run_id, s.sample_id, s.epoch,
           json_extract_string(s.store, '$.gradebook_workspace.store') AS store,
           unnest(TRY_CAST(json_extract(s.store, '$.gradebook_workspace.sandboxes') AS JSON[]))
               AS box
    FROM wh.samples s
    WHERE s.store IS NOT NULL AND json_exists(s.store, '$.gradebook_workspace')
)
SELECT run_id, sample_id, epoch,
       box->>'$.name' AS sandbox,
       box->>'$.status' AS status,
       box->>'$.digest' AS digest,
       TRY_CAST(box->>'$.bytes' AS BIGINT) AS bytes,
       TRY_CAST(box->>'$.stored_bytes' AS BIGINT) AS stored_bytes,
       TRY_CAST(box->>'$.files' AS INTEGER) AS files,
       TRY_CAST(json_extract(box, '$.paths') AS VARCHAR[]) AS paths,
       box->>'$.provider' AS provider,
       box->>'$.image' AS image,
       box->>'$.image_id' AS image_id,
       box->>'$.recipe' AS recipe,
       json_extract(box, '$.config') AS config,
       TRY_CAST(json_extract(box, '$.not_captured') AS VARCHAR[]) AS not_captured,
       box->>'$.error' AS error,
       TRY_CAST(box->>'$.seconds' AS DOUBLE) AS capture_s,
       store
FROM boxes;

CREATE OR REPLACE VIEW sandbox_calls AS
WITH graded AS (
    SELECT s.run_id, s.sample_id, s.epoch, s.scorer, s.fingerprint, s.attempt, s.status,
           s.reason, TRY_CAST(json_extract(s.metadata, '$.sandbox.calls') AS JSON[]) AS calls
    FROM wh.scores s
    WHERE s.metadata IS NOT NULL AND json_exists(s.metadata, '$.sandbox')
)
SELECT run_id, sample_id, epoch, scorer, fingerprint, attempt, status, reason,
       i AS call,
       calls[i]->>'$.sandbox' AS sandbox,
       calls[i]->>'$.op' AS op,
       TRY_CAST(json_extract(calls[i], '$.command') AS VARCHAR[]) AS command,
       calls[i]->>'$.cwd' AS cwd,
       calls[i]->>'$.user' AS "user",
       calls[i]->>'$.path' AS path,
       TRY_CAST(calls[i]->>'$.exit_code' AS INTEGER) AS exit_code,
       calls[i]->>'$.stdout' AS stdout,
       calls[i]->>'$.stderr' AS stderr,
       calls[i]->>'$.content' AS content,
       calls[i]->>'$.error' AS error,
       TRY_CAST(calls[i]->>'$.complete' AS BOOLEAN) AS complete,
       TRY_CAST(calls[i]->>'$.seconds' AS DOUBLE) AS duration_s
FROM graded, range(1, coalesce(len(calls), 0) + 1) AS r(i);
"""
