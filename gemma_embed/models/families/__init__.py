"""The package's model families, declared: one module per family, each exposing `FAMILY` (models/registry.py lists
them). A declaration is data and the names of its functions (`family.Deferred`): it imports neither torch nor
transformers, so the registry answers `gemma-embed models`, `--help` and a run's routing before any of them loads.
The functions live beside the towers they build (models/gemma4.py, ...); a test imports every declaration and
checks that each named function exists and that torch stayed out.
"""
