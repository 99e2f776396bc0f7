"""Inspect entry point: importing this module registers gradebook's extensions."""

from scorers.sandbox import provider  # noqa: F401  (registers the "gradebook" sandbox provider)
