"""Provenance records (a code dep of every stage), and what only reports them: MLflow tracking, run
logs (``OUTPUT_NEUTRAL`` in :mod:`pipeline.lineage.provenance`) and ``bertrace trace``."""
