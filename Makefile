# The two commands of the README. Each sets up the environment first
# (tools/setup_env.sh: a few seconds when everything is already installed).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: env test demo lint gpu-check mutations clean-env compat

env:
	bash tools/setup_env.sh

# the test suite (what CI runs)
test: env
	$(PY) -m pytest tests -q -p no:cacheprovider $(PYTEST_ARGS)

# the main job
demo: env
	$(PY) tools/demo.py

# flake8 + isort + yapf check (setup.cfg); FIX=1 make lint rewrites
lint: env
	bash tools/lint.sh

# the CUDA checks (tests on cuda, fp32/fp16/bf16 steps of every config,
# NR methods, backbone speed/memory); CPU subset without CUDA
gpu-check: env
	$(PY) tools/analysis/gpu_check.py $(GPU_CHECK_ARGS)

# the mutation check: each deliberately broken implementation of
# tests/mutation/mutations.py must make its tests fail (~10 min)
mutations: env
	$(PY) tests/mutation/run_mutations.py --python $(PY) $(MUTATIONS)

clean-env:
	rm -rf $(VENV)

# the support matrix: the suite on each stack of tools/compat/stacks.py,
# each in its own cached venv (noxfile.py); writes docs/en/compat/matrix.md
compat:
	bash tools/compat/run.sh $(COMPAT_ARGS)
