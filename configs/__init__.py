"""Typed run configuration (pydantic) and the YAML files for every algorithm.

`configs.schema.RunConfig` validates a whole run; `configs.loading` resolves YAML + CLI overrides.
"""
