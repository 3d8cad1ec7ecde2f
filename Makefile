# mooncake-store: the two set-up commands are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: run test venv proto bench bench-compare peers clean lint node-client chaos chaos-deps

$(STAMP): pyproject.toml setup.py mooncake_store/native/copyhash.c
	PYTHON=$(PYTHON) bash scripts/install-build-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# A local cluster on embedded defaults (master + two store nodes), a demo workload, then serve
# until Ctrl-C.  `make run ARGS=--exit` stops after the demo.
run: $(STAMP)
	$(VENV)/bin/mooncake-cluster --demo $(ARGS)

test: $(STAMP) node-client chaos-deps
	$(PY) -m pytest -q $(ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The Node.js conformance client's runtime and npm packages (clients/node; see the script).
node-client:
	bash scripts/install-node-client.sh

# Debian's faketime for the chaos harness's clock-step faults (see the script; skipped without).
chaos-deps:
	bash scripts/install-deps.sh

# The chaos harness (README "Chaos"), e.g. `make chaos ARGS="--duration 300 --nodes 3"`.
chaos: $(STAMP) chaos-deps
	$(PY) scripts/chaos.py $(ARGS)

# Regenerate the gRPC stubs from proto/ (the generated files are committed so a fresh clone works).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=mooncake_store/_proto \
		--pyi_out=mooncake_store/_proto --grpc_python_out=mooncake_store/_proto \
		proto/mooncake_store.proto
	sed -i 's/^import mooncake_store_pb2 as/from . import mooncake_store_pb2 as/' \
		mooncake_store/_proto/mooncake_store_pb2_grpc.py

bench: $(STAMP)
	$(PY) scripts/bench.py $(ARGS)

# The real Mooncake Store and Redis, for scripts/bench_compare.py (not needed by the tests).
peers:
	bash scripts/install-peers.sh

bench-compare: $(STAMP)
	$(PY) scripts/bench_compare.py $(ARGS)

lint: $(STAMP)
	$(PIP) install --quiet -e '.[test,dev]'
	$(VENV)/bin/ruff check mooncake_store tests scripts
	$(VENV)/bin/ruff format --check mooncake_store tests scripts
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .peers-venv mooncake-data .pytest_cache clients/node/node_modules build \
		mooncake_store/_copyhash*.so
