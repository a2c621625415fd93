"""Real models from PyPI packages, prepared as plain HF folders SGLang loads (no model hub)."""
