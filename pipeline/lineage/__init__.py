"""Provenance records, MLflow tracking and ``bertrace trace``."""
