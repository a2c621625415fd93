# The two set-up commands of the README. Each creates or updates .venv first.
.PHONY: venv demo test test-fast bench

venv:
	@bash scripts/setup_venv.sh

demo: venv
	.venv/bin/python -m sgl_adaspec.demo

# Every test, slow ones included (CI runs this).
test: venv
	.venv/bin/python -m pytest -q

# Skips tests marked slow.
test-fast: venv
	.venv/bin/python -m pytest -q -m "not slow"

bench: venv
	.venv/bin/python benchmarks/cpu_spec_speed.py
