"""Inspect entry point: importing this module registers gradebook's extensions."""
