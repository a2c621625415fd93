"""Every module that touches SGLang: the hooks, the platform layer, the scheduler and DP
adapters, the plugin's registration, launcher and Engine. Nothing outside this package
imports SGLang (`tests/test_boundary.py`)."""
