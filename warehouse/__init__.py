"""gradebook: warehouse — the DuckDB score history (schema, log ingest, score writes, views).

The documented views (runs, samples, messages, scores, current_scores, verifiers, latest_scores,
run_metrics, grade_flips, score_history) are the user interface;
see docs/reference/warehouse.md.
"""

from warehouse.connection import WarehouseError, WarehouseLocked, WarehouseUnusable
from warehouse.ingest import IngestResult
from warehouse.migrations import MIGRATIONS, SCHEMA_VERSION, Migration, SchemaTooNew
from warehouse.schema import SAMPLES_TO_SCORE_SCHEMA, SCORE_KEY, SCORE_SCHEMA
from warehouse.store import (
    DEFAULT_DB,
    Warehouse,
    WarehouseMissing,
    stage_scores,
)

__all__ = [
    "DEFAULT_DB",
    "MIGRATIONS",
    "SAMPLES_TO_SCORE_SCHEMA",
    "SCHEMA_VERSION",
    "SCORE_KEY",
    "SCORE_SCHEMA",
    "IngestResult",
    "LogReadError",
    "Migration",
    "SchemaTooNew",
    "Warehouse",
    "WarehouseError",
    "WarehouseLocked",
    "WarehouseMissing",
    "WarehouseUnusable",
    "stage_scores",
]


def __getattr__(name: str) -> object:
    # LogReadError lives with the log readers, which import inspect_ai: load them on first use.
    if name == "LogReadError":
        from warehouse.logs import LogReadError

        return LogReadError
    raise AttributeError(f"module 'warehouse' has no attribute {name!r}")
