"""Scheduling around speculation: SLO state, cost model and budget, SGLang scheduler adapter."""
