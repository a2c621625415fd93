"""SLO-aware adaptive speculative decoding for SGLang."""
