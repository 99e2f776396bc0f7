"""Schema for release gates and pass@k, appended to warehouse.migrations.MIGRATIONS.

Kept apart so the gate's schema is read next to the gate's code; the migration runner owns the
order and the transactions.
"""

from __future__ import annotations

GATES_TABLE_SQL = """
-- One row per gate evaluation (append-only): what was decided, on which numbers, under which
-- verifier fingerprints, so a release decision can be audited after the verifier moved on.
CREATE TABLE wh.gates (
    gate_id VARCHAR NOT NULL,
    created TIMESTAMPTZ NOT NULL,
    run_id VARCHAR NOT NULL,
    task VARCHAR,
    model VARCHAR,
    verdict VARCHAR NOT NULL,         -- pass | fail | cannot_evaluate
    exit_code INTEGER NOT NULL,       -- 0 | 1 | 2, what `gradebook gate` exited with
    rules JSON,                       -- the GateRules applied
    results JSON,                     -- [{rule, scorer, value, threshold, op, passed, detail}]
    fingerprints JSON,                -- {scorer: fingerprint used}
    baseline_run_id VARCHAR,
    metrics JSON,                     -- {scorer: {n_samples, accuracy, accuracy_strict, ...}}
    problems JSON,                    -- why it could not be evaluated, with the command to run
    sweep VARCHAR
);

CREATE VIEW gates AS SELECT * FROM wh.gates;

CREATE VIEW latest_gates AS
SELECT * FROM wh.gates
QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY created DESC, gate_id DESC) = 1;
"""

# pass@k (Chen et al. 2021, unbiased): per sample n = the run's epochs (a missing or unscored
# attempt counts as a failed one, like accuracy_strict) and c = attempts scored 1;
# pass@k = 1 - prod_{i=n-c+1..n} (1 - k/i), averaged over the run's samples.
# run_metrics gains `epochs` and `pass_at_k DOUBLE[]` where pass_at_k[k] is pass@k (DuckDB lists
# are 1-based); the previous definition is kept as run_metrics_base and wrapped, so this
# migration does not restate (and cannot drift from) how the base metrics are computed.
PASS_AT_K_SQL = """
CREATE OR REPLACE VIEW run_pass_at_k AS
WITH per_sample AS (
    SELECT s.run_id, s.scorer, s.fingerprint, s.sample_id,
           greatest(coalesce(any_value(r.epochs), 1), count(*))::INTEGER AS n,
           count(*) FILTER (WHERE s.status = 'scored' AND s.value >= 1) AS c
    FROM wh.scores s LEFT JOIN wh.runs r USING (run_id)
    GROUP BY ALL
),
per_k AS (
    SELECT run_id, scorer, fingerprint, sample_id, n, c,
           unnest(range(1, n + 1)) AS k
    FROM per_sample
)
SELECT run_id, scorer, fingerprint, k::INTEGER AS k,
       avg(CASE WHEN c = 0 THEN 0.0
                ELSE 1.0 - list_product([1.0 - k / i FOR i IN range(n - c + 1, n + 1)])
           END) AS pass_at_k,
       count(*) AS n_problems
FROM per_k
GROUP BY ALL;

ALTER VIEW run_metrics RENAME TO run_metrics_base;

CREATE VIEW run_metrics AS
SELECT m.*, coalesce(r.epochs, 1) AS epochs, p.pass_at_k
FROM run_metrics_base m
LEFT JOIN wh.runs r ON r.run_id = m.run_id
LEFT JOIN (
    SELECT run_id, scorer, fingerprint, list(pass_at_k ORDER BY k) AS pass_at_k
    FROM run_pass_at_k GROUP BY ALL
) p ON p.run_id = m.run_id AND p.scorer = m.scorer AND p.fingerprint = m.fingerprint;
"""
