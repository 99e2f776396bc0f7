"""`gradebook report`: a self-contained HTML page of a run's gates, metrics and grade flips.

- `data`: what the report shows, as plain data;
- `summary`: fills it from the warehouse's views;
- `charts`: the score history and coverage charts (plotly figures);
- `html`: the page itself (no network: everything is inlined).
"""
