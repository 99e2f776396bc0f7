"""gradebook: scorers."""
