# Everyday commands (run inside the project's virtualenv: pip install -e ".[test]").
.PHONY: test test-fast lint types check fix docs bench

test:  ## every tier, as CI runs it: in parallel (pytest-xdist), a file per worker at a time, the 30 slowest listed
	python -m pytest -n auto --dist loadfile --durations=30

test-fast:  ## the inner loop: in-process tests only, at most 8 examples per property test (tests/tiers.py)
	python -m pytest -n auto --dist loadfile -m "not slow and not subprocess and not browser" --hypothesis-profile=fast

lint:
	ruff check .

types:  ## mypy on the core modules ([tool.mypy] in pyproject.toml)
	mypy

check: lint types test-fast  ## lint, types and the in-process tier

fix:
	ruff check --fix .

docs:  ## regenerate docs/cli.md (the command reference) and docs/catalog.md (the query catalog)
	python tests/test_docs.py --update

bench:
	python -m tests.benchmarks.bench --size medium
