"""gradebook: warehouse."""
