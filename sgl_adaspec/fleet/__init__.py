"""Several plugin servers behind sglang-router: the SLO-aware gateway (`gateway`, stdlib only)
and its routing rule (`routing`), on each server's fleet view (`GET /adaspec/slo_load`)."""
