"""The SQL of `run_metrics` and `grade_flips`, built to stay fast over millions of score rows.

Why: grouping every score row by sample for pass@k (trivial when each sample has one attempt)
and self-joining the whole score table on its string key both grow with the history, which only
grows. docs/reference/warehouse.md documents the views' columns.

* `run_metrics` is one aggregation pass over `wh.scores`. pass@k needs per-sample attempt counts
  only where a sample can have several attempts (the run has epochs > 1, or its scores span more
  than one epoch); everywhere else each sample has exactly one score row (the write path keeps
  keys unique), so pass@1 = passed rows / rows. The multi-attempt groups are counted per sample,
  then as a histogram of (n, c), so the closed form is evaluated once per distinct (n, c).
* `grade_flips` reads `wh.flip_pairs`: every ordered pair of score rows of one (scorer, run,
  sample, epoch) under different fingerprints whose status or value differ, with both rows'
  verdicts. The write path (`warehouse.store._append_scores`) adds the pairs a batch creates in
  the same transaction as the batch; its migration fills it from the scores already stored.
  Which fingerprint is older is still decided when queried (`fingerprint_order`), so registering
  a verifier later reorders pairs exactly as before.
"""

from __future__ import annotations

# The pairs a set of score rows `new` (a relation with SCORE_SCHEMA columns) forms with the rows
# in `existing`, in both orientations. Used by the backfill below and by the write path.
FLIP_PAIR_COLUMNS = """
    scorer, run_id, sample_id, epoch,
    old_fingerprint, new_fingerprint, old_status, new_status, old_value, new_value,
    old_answer, new_answer, old_explanation, new_explanation
"""


def flip_pairs_select(
    new: str, existing: str, *, both_orientations: bool, attempts: bool = True
) -> str:
    """SQL selecting the flip pairs between rows of `new` and rows of `existing`.

    Args:
        new: a relation (table, view or registered Arrow table) of score rows.
        existing: another relation of score rows (may be the same as `new`).
        both_orientations: also emit (existing -> new) for each (new -> existing) pair; False
            when `new` and `existing` are the same rows, where the join already yields both.
        attempts: also select both rows' `attempt` (warehouse.score_attempts); False only for
            the flip pairs' backfill, which runs before those columns exist.
    """
    attempt_cols = ", o.attempt AS o_attempt, n.attempt AS n_attempt" if attempts else ""
    join = f"""
        SELECT o.scorer, o.run_id, o.sample_id, o.epoch,
               o.fingerprint AS o_fp, n.fingerprint AS n_fp, o.status AS o_status,
               n.status AS n_status, o.value AS o_value, n.value AS n_value,
               o.answer AS o_answer, n.answer AS n_answer,
               o.explanation AS o_explanation, n.explanation AS n_explanation{attempt_cols}
        FROM {new} o JOIN {existing} n
          ON o.scorer = n.scorer AND o.run_id = n.run_id
         AND o.sample_id = n.sample_id AND o.epoch = n.epoch
         AND o.fingerprint <> n.fingerprint
        WHERE o.status IS DISTINCT FROM n.status OR o.value IS DISTINCT FROM n.value
    """
    if not both_orientations:
        return join
    # one join, read in both directions (joining twice would scan `existing` twice)
    forward, backward = (
        (", o_attempt, n_attempt", ", n_attempt, o_attempt") if attempts else ("", "")
    )
    return f"""
        WITH p AS MATERIALIZED ({join})
        SELECT scorer, run_id, sample_id, epoch, o_fp, n_fp, o_status, n_status,
               o_value, n_value, o_answer, n_answer, o_explanation, n_explanation{forward} FROM p
        UNION ALL
        SELECT scorer, run_id, sample_id, epoch, n_fp, o_fp, n_status, o_status,
               n_value, o_value, n_answer, o_answer, n_explanation, o_explanation{backward} FROM p
    """


def grade_flips_view_sql(pairs: str = "wh.flip_pairs") -> str:
    """The `grade_flips` view over a relation of flip pairs (since attempts: the current ones)."""
    return f"""
CREATE OR REPLACE VIEW grade_flips AS
SELECT f.scorer, f.run_id, f.sample_id, f.epoch,
       f.old_fingerprint, f.new_fingerprint,
       f.old_status, f.new_status, f.old_value, f.new_value,
       f.old_answer, f.new_answer, f.old_explanation, f.new_explanation
FROM {pairs} f
JOIN fingerprint_order fo ON fo.scorer = f.scorer AND fo.fingerprint = f.old_fingerprint
JOIN fingerprint_order fn ON fn.scorer = f.scorer AND fn.fingerprint = f.new_fingerprint
WHERE (fo.first_seen, fo.fingerprint) < (fn.first_seen, fn.fingerprint);
"""


def metric_views_sql(scores: str = "wh.scores") -> str:
    """`run_pass_at_k`, `run_metrics` and `run_metrics_base` over a relation of score rows
    (warehouse.score_attempts passes `current_scores`, the latest attempt of each score)."""
    return f"""
-- pass@k (Chen et al. 2021, unbiased), as in warehouse.gate_schema: per sample n = the run's epochs
-- (or more attempts when stored), c = attempts scored 1; averaged over the samples with n >= k.
-- Evaluated once per distinct (n, c) and weighted by how many samples share it.
CREATE OR REPLACE VIEW run_pass_at_k AS
WITH per_sample AS (
    SELECT s.run_id, s.scorer, s.fingerprint,
           greatest(coalesce(any_value(r.epochs), 1), count(*))::INTEGER AS n,
           count(*) FILTER (WHERE s.status = 'scored' AND s.value >= 1) AS c
    FROM {scores} s LEFT JOIN wh.runs r USING (run_id)
    GROUP BY s.run_id, s.scorer, s.fingerprint, s.sample_id
),
hist AS (
    SELECT run_id, scorer, fingerprint, n, c, count(*) AS samples FROM per_sample GROUP BY ALL
),
per_k AS (
    SELECT run_id, scorer, fingerprint, unnest(range(1, n + 1)) AS k, n, c, samples FROM hist
)
SELECT run_id, scorer, fingerprint, k::INTEGER AS k,
       sum(samples * CASE WHEN c = 0 THEN 0.0
                          ELSE 1.0 - list_product([1.0 - k / i FOR i IN range(n - c + 1, n + 1)])
                     END) / sum(samples) AS pass_at_k,
       sum(samples) AS n_problems
FROM per_k
GROUP BY ALL;

CREATE OR REPLACE VIEW run_metrics AS
WITH agg AS (
    -- one pass; sums of 0/1 flags instead of FILTER clauses (each FILTER re-evaluates its
    -- predicate over every row), the standard deviation from the sums of values and squares
    SELECT run_id, scorer, fingerprint,
           count(*) AS n_rows,
           sum((status = 'scored')::INTEGER)::BIGINT AS n_scored,
           sum((status = 'unscored')::INTEGER)::BIGINT AS n_unscored,
           sum((status = 'error')::INTEGER)::BIGINT AS n_error,
           sum(CASE WHEN status = 'scored' THEN value END) AS n_correct,
           sum(CASE WHEN status = 'scored' THEN value * value END) AS sum_sq,
           count(CASE WHEN status = 'scored' THEN value END) AS n_valued,
           sum((status = 'scored' AND value >= 1)::INTEGER)::BIGINT AS n_passed,
           min(epoch) = max(epoch) AS one_epoch
    FROM {scores} GROUP BY run_id, scorer, fingerprint
),
stored AS (SELECT run_id, count(*) AS n FROM wh.samples GROUP BY run_id),
base AS MATERIALIZED (
    SELECT agg.*, r.task, r.model, r.created, coalesce(r.epochs, 1) AS epochs,
           coalesce(stored.n, 0) AS n_stored
    FROM agg LEFT JOIN wh.runs r USING (run_id) LEFT JOIN stored USING (run_id)
),
multi AS (
    SELECT run_id, scorer, fingerprint, epochs FROM base WHERE epochs > 1 OR NOT one_epoch
),
per_sample AS (
    SELECT s.run_id, s.scorer, s.fingerprint,
           greatest(any_value(m.epochs), count(*))::INTEGER AS n,
           count(*) FILTER (WHERE s.status = 'scored' AND s.value >= 1) AS c
    FROM {scores} s
    JOIN multi m ON m.run_id = s.run_id AND m.scorer = s.scorer AND m.fingerprint = s.fingerprint
    GROUP BY s.run_id, s.scorer, s.fingerprint, s.sample_id
),
hist AS (
    SELECT run_id, scorer, fingerprint, n, c, count(*) AS samples FROM per_sample GROUP BY ALL
),
per_k AS (
    SELECT run_id, scorer, fingerprint, unnest(range(1, n + 1)) AS k, n, c, samples FROM hist
),
pass_k AS (
    SELECT run_id, scorer, fingerprint, k,
           sum(samples * CASE WHEN c = 0 THEN 0.0
                              ELSE 1.0 - list_product([1.0 - k / i FOR i IN range(n - c + 1, n + 1)])
                         END) / sum(samples) AS pass_at_k
    FROM per_k GROUP BY ALL
),
pass_list AS (
    SELECT run_id, scorer, fingerprint, list(pass_at_k ORDER BY k) AS pass_at_k
    FROM pass_k GROUP BY ALL
)
SELECT b.run_id, b.task, b.model, b.created, b.scorer, b.fingerprint,
       greatest(b.n_rows, b.n_stored) AS n_samples,
       b.n_scored, b.n_unscored, b.n_error,
       greatest(b.n_stored - b.n_rows, 0) AS n_pending,
       b.n_correct / b.n_valued AS accuracy,
       coalesce(b.n_correct, 0) / greatest(b.n_rows, b.n_stored) AS accuracy_strict,
       CASE WHEN b.n_valued > 1
            THEN sqrt(greatest((b.sum_sq - b.n_correct * b.n_correct / b.n_valued)
                               / (b.n_valued - 1), 0)) / sqrt(b.n_scored)
       END AS stderr,
       b.epochs,
       CASE WHEN b.epochs = 1 AND b.one_epoch THEN [b.n_passed / b.n_rows]
            ELSE p.pass_at_k END AS pass_at_k
FROM base b
LEFT JOIN pass_list p
  ON p.run_id = b.run_id AND p.scorer = b.scorer AND p.fingerprint = b.fingerprint;

-- kept for anything that read it: now the same numbers, taken from run_metrics
CREATE OR REPLACE VIEW run_metrics_base AS
SELECT * EXCLUDE (epochs, pass_at_k) FROM run_metrics;
"""


QUERY_VIEWS_SQL = (
    """CREATE TABLE wh.flip_pairs (
    scorer VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    sample_id VARCHAR NOT NULL,
    epoch INTEGER NOT NULL,
    old_fingerprint VARCHAR NOT NULL,
    new_fingerprint VARCHAR NOT NULL,
    old_status VARCHAR,
    new_status VARCHAR,
    old_value DOUBLE,
    new_value DOUBLE,
    old_answer VARCHAR,
    new_answer VARCHAR,
    old_explanation VARCHAR,
    new_explanation VARCHAR
);

INSERT INTO wh.flip_pairs
"""
    + flip_pairs_select("wh.scores", "wh.scores", both_orientations=False, attempts=False)
    + ";\n"
    + grade_flips_view_sql()
    + metric_views_sql()
)
