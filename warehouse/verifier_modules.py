"""Which module provides each verifier, so a command can say how to load it.

Why: a verifier from a sweep config's `verifier_modules` scored runs, but a later `score`,
`rescore`, `verifiers` or `gate` without that module did not know it (unknown verifier, a
KeyError, "cannot evaluate" for good). `wh.verifiers.module` records `Verifier.module` with each
fingerprint, and those commands name the exact `--verifier-module` to pass.

The recorded name is only ever shown, never imported: a warehouse may come from elsewhere, and
importing a module runs its code. Only modules the user names (`--verifier-module`,
`GRADEBOOK_VERIFIER_MODULES`, a config's `verifier_modules`) are imported.
"""

from __future__ import annotations

import duckdb

VERIFIER_MODULE_SQL = """
ALTER TABLE wh.verifiers ADD COLUMN module VARCHAR;

-- the view lists wh.verifiers' columns as they were when it was created
CREATE OR REPLACE VIEW verifiers AS SELECT * FROM wh.verifiers;
"""


def recorded_verifiers(con: duckdb.DuckDBPyConnection) -> dict[str, str | None]:
    """Every verifier the warehouse knows (registered, or with score rows) -> the module its
    latest registration recorded (None: not recorded, e.g. registered by an older gradebook)."""
    rows = con.execute(
        """
        SELECT name, arg_max(module, first_seen) FILTER (WHERE module IS NOT NULL)
        FROM (
            SELECT name, module, first_seen FROM wh.verifiers
            UNION ALL
            SELECT DISTINCT scorer, NULL, NULL FROM wh.scores
        ) GROUP BY name ORDER BY name
        """
    ).fetchall()
    return {name: module for name, module in rows}


def recorded_specs(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Verifier name -> the spec its latest registration recorded (migration 10: an Inspect
    scorer's registry name and params, its file, or `{"kind": "recorded"}` for scores a log
    held); verifiers registered without one are left out."""
    import json

    rows = con.execute(
        "SELECT name, arg_max(spec, first_seen)::VARCHAR FROM wh.verifiers "
        "WHERE spec IS NOT NULL GROUP BY name ORDER BY name"
    ).fetchall()
    out = {}
    for name, spec in rows:
        try:
            value = json.loads(spec)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            out[name] = value
    return out
