"""gradebook: tasks."""
