"""gradebook: flows."""
