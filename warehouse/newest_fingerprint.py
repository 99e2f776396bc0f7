"""Which fingerprint is a verifier's "newest": the one of its code as it is now.

Why: views ordered a scorer's fingerprints by when each was first registered, so after an edit,
a re-score and a revert the reverted-away fingerprint stayed "newest" in `latest_scores`,
`grade_flips`, the report and the scored log copies, while the gate (which fingerprints the
code) used the current one. SQL cannot fingerprint code, so the commands that do tell the
warehouse what they found:

* `wh.fingerprint_changes` (append-only): a row each time a command found a verifier's code at
  a fingerprint other than the one last recorded for it (`Warehouse.record_current`: the
  scoring stage, rescore, the watcher, the gate, `gradebook verifiers` and `report`). An edit,
  a revert and an edit back to an older version each add one row; the history is never
  rewritten. Filled from `wh.verifiers` on upgrade: a fingerprint used to be registered by the
  stage that first graded with it, so its registration is when it became current.
* `current_verifiers`: each scorer's latest row there, i.e. its current fingerprint.
* `fingerprint_order` orders a scorer's fingerprints by when each was last current
  (`ordered_at`; a fingerprint never recorded as current: when it was first seen, as before)
  and marks the `newest`: the current fingerprint when one is recorded.
* `latest_scores` and `grade_flips` (older -> newer) follow that order.
"""

from __future__ import annotations

# A fingerprint's place in its scorer's history: when it was last current, else first seen.
_FINGERPRINT_ORDER = """
CREATE OR REPLACE VIEW fingerprint_order AS
WITH seen AS (
    SELECT scorer, fingerprint, min(scored_at) AS first_scored FROM wh.scores GROUP BY ALL
),
became AS (
    SELECT scorer, fingerprint, max(since) AS last_current
    FROM wh.fingerprint_changes GROUP BY ALL
),
ordered AS (
    SELECT seen.scorer, seen.fingerprint,
           coalesce(v.first_seen, seen.first_scored) AS first_seen, v.label, b.last_current,
           coalesce(b.last_current, v.first_seen, seen.first_scored) AS ordered_at
    FROM seen
    LEFT JOIN wh.verifiers v ON v.name = seen.scorer AND v.fingerprint = seen.fingerprint
    LEFT JOIN became b ON b.scorer = seen.scorer AND b.fingerprint = seen.fingerprint
)
SELECT o.*,
       coalesce(
           o.fingerprint = c.fingerprint,
           o.fingerprint = arg_max(o.fingerprint, (o.ordered_at, o.fingerprint))
                               OVER (PARTITION BY o.scorer)
       ) AS newest
FROM ordered o LEFT JOIN current_verifiers c ON c.scorer = o.scorer;
"""

NEWEST_FINGERPRINT_SQL = (
    """
CREATE TABLE wh.fingerprint_changes (
    scorer VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    since TIMESTAMPTZ NOT NULL
);

INSERT INTO wh.fingerprint_changes
SELECT name, fingerprint, first_seen FROM wh.verifiers ORDER BY first_seen;

CREATE VIEW fingerprint_changes AS SELECT * FROM wh.fingerprint_changes;

CREATE VIEW current_verifiers AS
SELECT scorer, arg_max(fingerprint, since) AS fingerprint, max(since) AS since
FROM wh.fingerprint_changes GROUP BY scorer;
"""
    + _FINGERPRINT_ORDER
    + """
CREATE OR REPLACE VIEW latest_scores AS
SELECT s.* FROM current_scores s
SEMI JOIN (SELECT scorer, fingerprint FROM fingerprint_order WHERE newest) n
    ON s.scorer = n.scorer AND s.fingerprint = n.fingerprint;

CREATE OR REPLACE VIEW grade_flips AS
SELECT f.scorer, f.run_id, f.sample_id, f.epoch,
       f.old_fingerprint, f.new_fingerprint,
       f.old_status, f.new_status, f.old_value, f.new_value,
       f.old_answer, f.new_answer, f.old_explanation, f.new_explanation
FROM wh.current_flip_pairs f
JOIN fingerprint_order fo ON fo.scorer = f.scorer AND fo.fingerprint = f.old_fingerprint
JOIN fingerprint_order fn ON fn.scorer = f.scorer AND fn.fingerprint = f.new_fingerprint
WHERE (fo.ordered_at, fo.fingerprint) < (fn.ordered_at, fn.fingerprint);
"""
)

# Appends a change for each (scorer, fingerprint) of $scorers/$fingerprints whose latest
# recorded fingerprint differs; returns those scorers. `since` strictly increases over the table,
# so "the latest row of a scorer" never ties.
RECORD_CURRENT_SQL = """
INSERT INTO wh.fingerprint_changes
SELECT i.scorer, i.fingerprint,
       (SELECT greatest(now(), coalesce(max(since) + INTERVAL 1 MICROSECOND, now()))
        FROM wh.fingerprint_changes)
FROM (SELECT unnest($scorers::VARCHAR[]) AS scorer,
             unnest($fingerprints::VARCHAR[]) AS fingerprint) i
LEFT JOIN (SELECT scorer, arg_max(fingerprint, since) AS fingerprint
           FROM wh.fingerprint_changes GROUP BY scorer) c USING (scorer)
WHERE c.fingerprint IS DISTINCT FROM i.fingerprint
RETURNING scorer
"""

# The same comparison, read-only: which of them would be recorded.
CHANGED_SQL = """
SELECT i.scorer
FROM (SELECT unnest($scorers::VARCHAR[]) AS scorer,
             unnest($fingerprints::VARCHAR[]) AS fingerprint) i
LEFT JOIN (SELECT scorer, arg_max(fingerprint, since) AS fingerprint
           FROM wh.fingerprint_changes GROUP BY scorer) c USING (scorer)
WHERE c.fingerprint IS DISTINCT FROM i.fingerprint
"""
