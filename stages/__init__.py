"""DVC stage entry points: ``python -m stages.<name>``. Each parses params, calls
``pipeline``, writes outputs, metrics, provenance and an MLflow run."""
