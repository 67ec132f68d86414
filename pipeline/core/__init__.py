"""Shared by every stage: the params layer, errors, atomic IO, on-disk formats, devices and CPU arithmetic."""
