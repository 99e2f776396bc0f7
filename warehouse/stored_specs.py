"""What rebuilds each verifier the warehouse has seen: its module, and its stored spec.

Why: a verifier from a sweep config scored runs, but a later `score`, `rescore`, `verifiers`,
`gate` or `report` without that config did not know it (unknown verifier, "cannot evaluate" for
good). `wh.verifiers.module` records `Verifier.module` with each fingerprint, and
`wh.verifier_specs` (append-only) the whole spec the verifier graded with: an Inspect scorer's
registry name or file and its params, its judge roles (model, base URL, config and the names of
the environment variables holding keys, never a key), a user module's file. Each row is sealed
(warehouse.spec_seal), so a command can tell the specs this user's own commands stored from
those of a warehouse that came from elsewhere; verifiers.stored decides what to rebuild.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb

from warehouse.spec_seal import is_sealed, seal

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


VERIFIER_SPECS_SQL = """
-- append-only: the spec each verifier was graded with, every time it changed (a judge moved to
-- another URL keeps its fingerprint but not its spec), sealed by the user who graded with it
CREATE TABLE wh.verifier_specs (
    name VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    spec JSON NOT NULL,
    seal VARCHAR,
    recorded_at TIMESTAMPTZ NOT NULL
);

CREATE OR REPLACE VIEW verifier_specs AS
SELECT name, fingerprint, spec, seal IS NOT NULL AS sealed, recorded_at,
       row_number() OVER (PARTITION BY name ORDER BY recorded_at DESC) = 1 AS latest
FROM wh.verifier_specs;
"""


@dataclass(frozen=True)
class StoredSpec:
    """A verifier's latest stored spec, and whether this user's seal vouches for it
    (warehouse.spec_seal): only then may it name a file to import or a judge to call."""

    spec: dict[str, Any]
    sealed: bool


def store_spec(con: duckdb.DuckDBPyConnection, name: str, fingerprint: str, spec: dict) -> None:
    """Record the spec a verifier grades with, sealed, unless it is already its latest (in the
    caller's transaction). Only a command that grades on the user's word calls this."""
    text = json.dumps(spec, sort_keys=True)
    stored_seal = seal(name, spec)
    latest = con.execute(
        "SELECT spec::VARCHAR, seal FROM wh.verifier_specs WHERE name = ? "
        "ORDER BY recorded_at DESC LIMIT 1",
        [name],
    ).fetchone()
    if latest is not None and _same(latest[0], spec) and latest[1] == stored_seal:
        return
    con.execute(
        "INSERT INTO wh.verifier_specs VALUES (?, ?, ?, ?, now())",
        [name, fingerprint, text, stored_seal],
    )


def _same(text: str | None, spec: dict) -> bool:
    try:
        return json.loads(text or "null") == spec
    except ValueError:
        return False


def recorded_specs(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Verifier name -> the spec its latest registration recorded (an Inspect scorer's registry
    name and params, its file, a module, or `{"kind": "recorded"}` for scores a log held);
    verifiers registered without one are left out."""
    return {name: stored.spec for name, stored in stored_specs(con).items()}


def stored_specs(con: duckdb.DuckDBPyConnection) -> dict[str, StoredSpec]:
    """Verifier name -> its latest stored spec and whether this user sealed it. A spec gradebook
    graded with comes before the `recorded` one of scores a log held, whatever their times."""
    rows = con.execute(
        """
        SELECT name, spec, seal FROM (
            SELECT name, spec::VARCHAR AS spec, seal, recorded_at AS stored_at, 1 AS pri
            FROM wh.verifier_specs
            UNION ALL
            SELECT name, spec::VARCHAR, NULL, first_seen, 0 FROM wh.verifiers
            WHERE spec IS NOT NULL
        )
        QUALIFY row_number() OVER (
            PARTITION BY name
            ORDER BY json_extract_string(spec, '$.kind') IS DISTINCT FROM 'recorded' DESC,
                     stored_at DESC, pri DESC
        ) = 1
        ORDER BY name
        """
    ).fetchall()
    out = {}
    for name, text, stored_seal in rows:
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            out[name] = StoredSpec(value, is_sealed(name, value, stored_seal))
    return out
