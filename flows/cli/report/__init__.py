"""`gradebook report`: a self-contained HTML page of a run's gates, metrics and grade flips.

- `summary`: what the report shows, read from the warehouse's views;
- `html`: the page itself (no network: everything is inlined).
"""
