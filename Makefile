# The two commands of the README: `make example` (the main job) and `make test`.
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: example test lint bench bench-quick clean docs clean-install upstream-mongoengine \
	upstream-django-sequences

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

example: $(VENV)/.installed
	$(PY) -m example_project

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Each extra alone in a fresh venv runs the README's quick start (needs PyPI),
# against the servers make test uses (the dev venv creates and drops their databases).
clean-install: $(VENV)/.installed
	$(PY) .ci/clean_install.py

# mongoengine's own test_signals (from the installed release's sdist) with our field.
UPSTREAM := $(VENV)/upstream
upstream-mongoengine: $(VENV)/.installed
	rm -rf $(UPSTREAM)/mongoengine && mkdir -p $(UPSTREAM)/mongoengine
	$(PY) -m pip download -q --no-deps --no-binary :all: -d $(UPSTREAM) \
		"mongoengine==$$($(PY) -c 'import mongoengine; print(mongoengine.__version__)')"
	tar xzf $(UPSTREAM)/mongoengine-*.tar.gz -C $(UPSTREAM)/mongoengine --strip-components 1
	AUTOSEQ_MONGOENGINE_SDIST=$(UPSTREAM)/mongoengine $(PY) -m pytest tests/test_mongoengine_upstream.py

# django-sequences' own tests/test_sequences.py against autoseq_django's API, on SQLite
# and PostgreSQL. Its sdist ships no tests: they come from a git clone (cloned here
# unless DJANGO_SEQUENCES_REPO names one); docs/django.md lists the differences.
DJANGO_SEQUENCES_REPO ?= $(UPSTREAM)/django-sequences
DJANGO_SEQUENCES_GIT ?= https://github.com/aaugustin/django-sequences
upstream-django-sequences: $(VENV)/.installed
	test -e $(DJANGO_SEQUENCES_REPO) || git clone -q --depth 1 \
		$(DJANGO_SEQUENCES_GIT) $(DJANGO_SEQUENCES_REPO)
	AUTOSEQ_DJANGO_SEQUENCES_REPO=$(abspath $(DJANGO_SEQUENCES_REPO)) \
		$(PY) -m pytest tests/test_django_sequences_upstream.py

bench: $(VENV)/.installed
	$(PY) -m benchmarks

bench-quick: $(VENV)/.installed
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The documentation site (mkdocs + material + mkdocstrings), built strictly:
# any warning (a broken link, an API page that cannot be rendered) fails it.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
