"""The `judge_usage` view: what each run's judge-graded scores cost in judge calls and tokens.

Why a view over score metadata: a judge scorer's row keeps its calls as evidence
(`metadata.judge`: per call the model, prompt, raw reply, token usage and error;
scorers.inspect_scorers.judges), so an audit or a new verdict parser needs no call, and the
tokens are counted from the same record. Every attempt counts: a failed call that was retried
was still paid for. docs/reference/warehouse.md documents the columns.
"""

from __future__ import annotations

JUDGE_USAGE_SQL = """
CREATE OR REPLACE VIEW judge_usage AS
WITH calls AS (
    SELECT s.run_id, s.scorer, s.fingerprint, s.sample_id, s.epoch, s.attempt,
           unnest(CAST(json_extract(s.metadata, '$.judge') AS JSON[])) AS call
    FROM wh.scores s
    WHERE s.metadata IS NOT NULL AND json_exists(s.metadata, '$.judge')
)
SELECT
    run_id,
    scorer,
    fingerprint,
    count(DISTINCT (sample_id, epoch)) AS samples,
    count(DISTINCT (sample_id, epoch, attempt)) AS attempts,
    count(*) AS calls,
    count(*) FILTER (WHERE call->>'$.error' IS NOT NULL OR CAST(call->>'$.pending' AS BOOLEAN))
        AS failed_calls,
    list_distinct(list(call->>'$.model')) AS judge_models,
    coalesce(sum(CAST(call->>'$.usage.input_tokens' AS BIGINT)), 0) AS input_tokens,
    coalesce(sum(CAST(call->>'$.usage.output_tokens' AS BIGINT)), 0) AS output_tokens,
    coalesce(sum(CAST(call->>'$.usage.total_tokens' AS BIGINT)), 0) AS total_tokens
FROM calls
GROUP BY run_id, scorer, fingerprint;
"""
