# The two commands of the README: `make example` (the main job) and `make test`.
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: example test lint bench bench-quick clean docs clean-install upstream-mongoengine \
	upstream-django-sequences django-upstream

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
	AUTOSEQ_MONGOENGINE_SDIST=$(UPSTREAM)/mongoengine $(PY) -m pytest tests/mongoengine/test_upstream.py

# django-sequences' own tests/test_sequences.py against autoseq_django's API, on SQLite
# and PostgreSQL. Its sdist ships no tests: they come from a git clone (cloned here
# unless DJANGO_SEQUENCES_REPO names one); docs/django.md lists the differences.
DJANGO_SEQUENCES_REPO ?= $(UPSTREAM)/django-sequences
DJANGO_SEQUENCES_GIT ?= https://github.com/aaugustin/django-sequences
upstream-django-sequences: $(VENV)/.installed
	test -e $(DJANGO_SEQUENCES_REPO) || git clone -q --depth 1 \
		$(DJANGO_SEQUENCES_GIT) $(DJANGO_SEQUENCES_REPO)
	AUTOSEQ_DJANGO_SEQUENCES_REPO=$(abspath $(DJANGO_SEQUENCES_REPO)) \
		$(PY) -m pytest tests/django/test_django_sequences_upstream.py

# Django's own test apps (from the installed release's sdist) with SequenceAutoField as
# DEFAULT_AUTO_FIELD, then BigAutoField, on SQLite and PostgreSQL; fails when a test
# fails only with ours. DJANGO_UPSTREAM_BACKENDS / DJANGO_UPSTREAM_APPS narrow it.
DJANGO_UPSTREAM_BACKENDS ?= sqlite,postgres
DJANGO_UPSTREAM_APPS ?= basic,bulk_create,model_forms,admin_views,fixtures,fixtures_regress,serializers,model_inheritance,delete,migrations
django-upstream: $(VENV)/.installed
	rm -rf $(UPSTREAM)/django && mkdir -p $(UPSTREAM)/django
	$(PY) -m pip download -q --no-deps --no-binary :all: -d $(UPSTREAM) \
		"django==$$($(PY) -c 'import django; print(django.__version__)')"
	tar xzf $(UPSTREAM)/django-$$($(PY) -c 'import django; print(django.__version__)').tar.gz \
		-C $(UPSTREAM)/django --strip-components 1
	$(PY) .ci/django_upstream.py $(UPSTREAM)/django \
		--backends $(DJANGO_UPSTREAM_BACKENDS) --apps $(DJANGO_UPSTREAM_APPS)

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
