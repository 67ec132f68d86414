"""Pre-training objectives, one class per file (``base.py``: the interface; ``registry.py``: by name)."""
