# The two commands of the README. Each sets up what it needs by itself (scripts/setup.sh).
.PHONY: demo test lint setup bench

demo:            ## set up, run a small real characterization job on this CPU, and print its report
	@scripts/setup.sh
	@scripts/demo.sh

test:            ## set up (including Slurm and Chromium when root) and run lint + the whole test suite
	@scripts/setup.sh --system
	@.venv/bin/ruff check src tests benchmarks
	@.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=25

lint:
	@.venv/bin/ruff check src tests benchmarks

setup:
	@scripts/setup.sh

bench:           ## the benchmarks in benchmarks/ (not part of CI); those whose data is absent skip with one line
	@scripts/setup.sh
	@.venv/bin/python benchmarks/run_all.py $(BENCH)
