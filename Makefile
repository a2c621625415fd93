# The two set-up commands of the README. Each creates or updates .venv first.
.PHONY: venv demo test test-slow test-all bench bench-serving gpu-check

venv:
	@bash scripts/setup_venv.sh

demo: venv
	.venv/bin/python -m sgl_adaspec.demo

# The default test run: everything but the tests marked slow (well under 15 min on 2 cores).
test: venv
	.venv/bin/python -m pytest -q -m "not slow"

# The slow tier (more real-server end-to-end runs); CI runs it after `make test`.
test-slow: venv
	.venv/bin/python -m pytest -q -m slow

test-all: venv
	.venv/bin/python -m pytest -q

bench: venv
	.venv/bin/python benchmarks/cpu_spec_speed.py

# SGLang's own serving benchmark: no speculation vs adaserve, side by side (docs/benchmarks.md).
bench-serving: venv
	.venv/bin/python -m sgl_adaspec.bench.sglang_serving $(ARGS)

# The GPU path on one CUDA GPU (its own venv, .venv-gpu; see scripts/gpu_check.sh).
gpu-check:
	bash scripts/gpu_check.sh
