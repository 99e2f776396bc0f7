"""Grading attempts, so an unscored sample can be graded again without losing history.

Why: a sample left `unscored` for an infrastructure reason (Docker down, a scoring worker killed,
the stage's time limit on an overloaded host) could not be graded again under the same verifier
fingerprint if a score's key were (run_id, sample_id, epoch, scorer, fingerprint), since rows
are never updated. So a retry is a new row with the next `attempt` number; the row it replaces
stays in `wh.scores` (principle 7, append-only history).

* `wh.scores.attempt` (1 for every existing row) extends the key. The write path accepts
  attempt n > 1 only when attempt n - 1 of the same key is stored, `unscored`, with a retryable
  reason (`warehouse.schema.RETRYABLE_REASONS`), so only unscored rows are ever superseded and
  attempts of a key are 1..n without gaps.
* `current_scores` is the latest attempt of every key: `wh.scores` minus the rows named by
  `wh.superseded_scores` (attempt n - 1 of every row with attempt n > 1). Retries are rare, so
  that relation is small; and since only unscored rows can be superseded, only unscored rows
  are checked against it (scored and error rows pass straight through).
* Every view that picks "the" score of a sample reads `current_scores`: `latest_scores`,
  `run_metrics` (and `run_metrics_base`, `score_history`, the gates), `run_pass_at_k`.
* A task image rebuilt with a new ID (schema 15): a sandbox scorer's verdict depends on the
  image the sample's workspace was restored into, which is the sample's, not the verifier's,
  so it is not in the fingerprint. Such a row names it in `image_id`
  (warehouse.verdict_images), and attempt n + 1 may also supersede a stored attempt n that has
  an image when the new row names a different one (the scoring stage grades again only the
  samples whose image restore would use now differs: workspaces.image_regrade). A re-grade
  that could not restore (no image) is not written, so a verdict is never replaced by
  "unscored" for want of an image. `current_scores` checks unscored rows and rows with an
  image against `wh.superseded_scores`; the rest cost a null test.
* `wh.flip_pairs` gains the attempts of both rows; `grade_flips` drops pairs with a superseded
  side. Flips still compare verdicts across fingerprints only: a retry (same fingerprint) that
  turns unscored into scored is never a flip, and a flip against a superseded unscored row
  disappears once the retry is stored.
"""

from __future__ import annotations

from warehouse.metric_views import grade_flips_view_sql, metric_views_sql

RETRY_ATTEMPTS_SQL = (
    """
ALTER TABLE wh.scores ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE wh.flip_pairs ADD COLUMN old_attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE wh.flip_pairs ADD COLUMN new_attempt INTEGER NOT NULL DEFAULT 1;

CREATE OR REPLACE VIEW scores AS SELECT * FROM wh.scores;

-- the rows a later attempt replaced (the write path keeps attempts consecutive)
CREATE VIEW wh.superseded_scores AS
SELECT run_id, sample_id, epoch, scorer, fingerprint, attempt - 1 AS attempt
FROM wh.scores WHERE attempt > 1;

-- Only unscored rows are ever superseded (the write path's rule), so only they are probed:
-- hashing the key of every scored row made run_metrics ~1.6x slower for nothing.
CREATE VIEW current_scores AS
SELECT * FROM wh.scores WHERE status <> 'unscored'
UNION ALL
SELECT s.* FROM wh.scores s
ANTI JOIN wh.superseded_scores x USING (run_id, sample_id, epoch, scorer, fingerprint, attempt)
WHERE s.status = 'unscored';

CREATE OR REPLACE VIEW latest_scores AS
WITH newest AS (
    SELECT scorer, arg_max(fingerprint, (first_seen, fingerprint)) AS fingerprint
    FROM fingerprint_order GROUP BY scorer
)
SELECT s.* FROM current_scores s SEMI JOIN newest n
    ON s.scorer = n.scorer AND s.fingerprint = n.fingerprint;

CREATE VIEW wh.current_flip_pairs AS
SELECT f.* FROM wh.flip_pairs f
ANTI JOIN wh.superseded_scores o
  ON o.scorer = f.scorer AND o.run_id = f.run_id AND o.sample_id = f.sample_id
 AND o.epoch = f.epoch AND o.fingerprint = f.old_fingerprint AND o.attempt = f.old_attempt
ANTI JOIN wh.superseded_scores n
  ON n.scorer = f.scorer AND n.run_id = f.run_id AND n.sample_id = f.sample_id
 AND n.epoch = f.epoch AND n.fingerprint = f.new_fingerprint AND n.attempt = f.new_attempt;
"""
    + grade_flips_view_sql("wh.current_flip_pairs")
    + metric_views_sql("current_scores")
)

IMAGE_ATTEMPTS_SQL = """
ALTER TABLE wh.scores ADD COLUMN image_id VARCHAR;

-- a row with an image may be superseded too (a rebuilt image): it is probed like an unscored
-- one; the other rows pass on a null test. Three branches, not `unscored OR image`: an OR
-- there keeps the scan from filtering on either (docs/reference/warehouse.md: current_scores).
CREATE OR REPLACE VIEW current_scores AS
SELECT * FROM wh.scores WHERE status <> 'unscored' AND image_id IS NULL
UNION ALL
SELECT s.* FROM wh.scores s
ANTI JOIN wh.superseded_scores x USING (run_id, sample_id, epoch, scorer, fingerprint, attempt)
WHERE s.status = 'unscored'
UNION ALL
SELECT s.* FROM wh.scores s
ANTI JOIN wh.superseded_scores x USING (run_id, sample_id, epoch, scorer, fingerprint, attempt)
WHERE s.status <> 'unscored' AND s.image_id IS NOT NULL;
"""
