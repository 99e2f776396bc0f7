"""Cluster mode: generation on GPU workers and scoring on CPU workers through a shared Prefect
server (`gradebook cluster ...`, docs/how-to/cluster.md).

- `setup`: the work pools and deployments, and the command a worker machine runs;
- `dispatch`: a sweep's generate and score steps sent to those pools, and their results read back;
- `work`: the flows the workers run (`cluster_generate`, `cluster_score`).
"""
