"""gradebook: sweeps — a sweep as declared, and what its config names, resolved.

- `config`         the sweep config (TOML): load_config, SweepConfig, ConfigError
- `tasks`          the tasks a config names, loaded as Inspect Tasks
- `model_servers`  the model servers a config names, checked before generation
- `mock_server`    a local OpenAI-compatible server: the demo's and the tests' model

The flows take a `SweepConfig`; nothing here imports Prefect or runs a flow.
"""
