"""Fine-tuning task types, one class per file (``base.py``: the interface; ``registry.py``: by name)."""
