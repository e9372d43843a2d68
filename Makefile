# make book   -> .venv (if needed), every notebook executed at $(PROFILE), HTML in _build/html
# make test   -> .venv (if needed), `make lint`, then the test suite (unit tests, notebooks and a smoke-profile book build)
# make test-fast -> the tests not marked slow (no notebooks, no book build, no wheel): under 3 minutes on 2 cores
# make lint   -> ruff check (pyproject.toml [tool.ruff]: pyflakes and the complexity caps)
# PROFILE=smoke make book   builds the CI-sized book in about a minute.

PROFILE ?= default
# Python 3.11 by default (pyproject: requires-python >=3.11); PYTHON=... overrides.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
# The torch CI tests and the book's numbers come from (pyproject accepts any torch >= 2.13); TORCH=... overrides.
TORCH ?= torch==2.14.1 torchvision==0.29.1
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mdlib-installed
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: book html test test-fast lint clean distclean

book: $(STAMP)
	$(PY) -m mdlib book --profile $(PROFILE)

# re-render the HTML from the notebooks executed last time
html: $(STAMP)
	$(PY) -m mdlib book --skip-execute

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

# The environment: created once, reinstalled when pyproject.toml changes; every extra ("all": the
# experiments, the book, numba, torchvision, the test tools). A .venv made before the distribution was
# renamed attention-mirror-descent still holds it as "mdlib": removed first, so one install owns the package.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if $(PY) -m pip show -q mdlib 2>/dev/null; then $(PY) -m pip uninstall -y mdlib; fi
	$(PY) -m pip install $(TORCH) -e '.[all]'
	touch $@

clean:
	rm -rf _build notebooks/*.ipynb notebooks/.ipynb_checkpoints book/parameters.md book/scorecard.md book/scorecard-forest.png

distclean: clean
	rm -rf $(VENV) *.egg-info build dist
