# The two commands of the README. Each sets up the environment first
# (tools/setup_env.sh: a few seconds when everything is already installed).
VENV ?= .venv
# $(call quote,PATH): PATH as one shell word (single-quoted, its ' escaped),
# so that a VENV with spaces is one path in every recipe
quote = '$(subst ','\'',$(1))'
PY = $(call quote,$(VENV)/bin/python)
PYTEST_ARGS ?=
SEED ?=
JOBS ?= 2

.PHONY: env test demo lint gpu-check mutations docs docs-env clean-env compat

# VENV=path: another virtualenv (tools/setup_env.sh's MMSOFT_VENV)
env:
	MMSOFT_VENV=$(call quote,$(VENV)) bash tools/setup_env.sh

# the test suite (what CI runs) in a random order (pytest-randomly) on
# JOBS worker processes (pytest-xdist; a module's tests run on one worker;
# JOBS=0: in this process, one after another); the seed is printed at the
# end: SEED=N replays that order, PYTEST_ARGS='-p no:randomly' runs the
# files in their order
test: env
	$(PY) -m pytest tests -q -p no:cacheprovider -p randomly \
	    -n $(JOBS) --dist loadfile \
	    $(if $(SEED),--randomly-seed=$(SEED)) $(PYTEST_ARGS)

# the main job
demo: env
	$(PY) tools/demo.py

# flake8 + isort + yapf check (setup.cfg); FIX=1 make lint rewrites
lint: env
	MMSOFT_VENV=$(call quote,$(VENV)) bash tools/lint.sh

# the CUDA checks (tests on cuda, fp32/fp16/bf16 steps of every config,
# one timed iteration of each paper recipe for the model zoo's estimates,
# NR methods, backbone speed/memory); CPU subset without CUDA;
# GPU_CHECK_ARGS='--sections ...' runs some sections only
gpu-check: env
	$(PY) tools/analysis/gpu_check.py $(GPU_CHECK_ARGS)

# the mutation check: generated mutants (mutmut, per module group of
# tools/mutation/run_mutmut.py, each within its budget; GROUPS='loading'
# runs some)
mutations: env
	@$(PY) -c 'import mutmut' 2>/dev/null || $(PY) -m pip install -q \
	    -c requirements/constraints.txt -r requirements/mutation.txt
	$(PY) tools/mutation/run_mutmut.py $(GROUPS)

# the documentation site (docs/en, Sphinx + MyST) -> docs/_build/html,
# warnings are errors
docs: docs-env
	$(PY) docs/gen_tables.py
	$(PY) -m sphinx -b html -W --keep-going -n -q docs/en docs/_build/html
	@echo "docs: file://$(CURDIR)/docs/_build/html/index.html"

# the docs' environment in $(VENV) (created when missing): Sphinx and its
# theme (requirements/docs.txt) and what autodoc imports, CPU torch and
# mmengine (requirements/docs_api.txt); only the files not yet installed
# (after `make env`: docs.txt alone); never mmcv or the codebases
docs-env:
	@test -x $(PY) || $${MMSOFT_PYTHON:-python3} -m venv $(call quote,$(VENV))
	@missing="$$($(PY) docs/gen_tables.py --docs-env 2>/dev/null)" || { \
	    missing=$${missing:-requirements/docs.txt requirements/docs_api.txt}; \
	    echo "docs: installing $$missing (Sphinx, MyST, furo; CPU torch + mmengine for autodoc) into "$(call quote,$(VENV)); \
	    PIP_CONSTRAINT=requirements/constraints.txt $(PY) -m pip install -q \
	    $$(printf -- '-r %s ' $$missing); }

# removes $(VENV) only if it is a virtualenv (its pyvenv.cfg), never a
# folder that is not one (VENV=. or a typo)
clean-env:
	@v=$(call quote,$(VENV)); \
	if [ ! -e "$$v" ] && [ ! -L "$$v" ]; then \
	    echo "clean-env: $$v does not exist: nothing to remove"; \
	elif [ -L "$$v" ] || [ ! -f "$$v/pyvenv.cfg" ]; then \
	    echo "clean-env: $$v is not a virtualenv (no pyvenv.cfg, or a link): refusing to delete it; set VENV to the virtualenv's own path" >&2; \
	    exit 1; \
	else rm -rf -- "$$v" && echo "clean-env: removed the virtualenv $$v"; fi

# the support matrix: the suite on each stack of tools/compat/stacks.py,
# each in its own cached venv (noxfile.py); writes docs/en/compat/matrix.md
compat:
	bash tools/compat/run.sh $(COMPAT_ARGS)
