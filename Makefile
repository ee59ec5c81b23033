# The two commands of the README. Each sets up what it needs by itself (scripts/setup.sh).
.PHONY: demo test lint setup bench

demo:            ## set up, run a small real characterization job on this CPU, and print its report
	@scripts/setup.sh
	@scripts/demo.sh

test:            ## set up (including Slurm and Chromium when root), run lint (ruff, import contracts, mypy) + the whole test suite
	@scripts/setup.sh --system
	@$(MAKE) --no-print-directory lint
	@.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=25

lint:            ## ruff, the import contracts (pyproject.toml [tool.importlinter]) and mypy ([tool.mypy])
	@.venv/bin/ruff check src tests benchmarks
	@.venv/bin/lint-imports
	@.venv/bin/mypy

setup:
	@scripts/setup.sh

bench:           ## the benchmarks in benchmarks/ (not part of CI); those whose data is absent skip with one line
	@scripts/setup.sh
	@.venv/bin/python benchmarks/run_all.py $(BENCH)
