"""Inspect entry point: importing this module registers gradebook's extensions."""

from scorers import sandboxenv  # noqa: F401  (registers the "gradebook" sandbox provider)
