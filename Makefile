# The README's two commands. Both run scripts/setup.sh first (idempotent: seconds when the
# virtual environment and the system data are in place).
PROFILE ?= cpu evidence
VENV ?= .venv
export FEDTSP_VENV := $(VENV)

.PHONY: setup reproduce test lint

setup:
	@scripts/setup.sh

# Regenerate every table and figure at each profile of $(PROFILE) (default: the cpu screen,
# then the pre-registered evidence); extra flags via ARGS=...
reproduce: setup
	@set -e; for p in $(PROFILE); do $(VENV)/bin/fedtsp reproduce --profile $$p $(ARGS); done

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Lint, then the whole test suite (pytest exits 5 if it collects nothing, which fails too).
test: lint
	$(VENV)/bin/python -m pytest -q
