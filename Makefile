# torchrr: the two commands are `make demo` and `make test`. Each sets up what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
PY := .venv/bin/python
CMAKE_FLAGS ?=

.PHONY: all setup configure build build-demo test demo bench fuzz dist clean

all: build

setup:
	@tools/setup.sh

$(BUILD)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DTORCHRR_PYTHON=$(CURDIR)/$(PY) $(CMAKE_FLAGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)
	@tools/install_into_venv.sh $(BUILD)

# The Python tests on JOBS workers (docs/testing.md): `make test PYTEST_ARGS=tests/python/replay`
# runs one area, PYTEST_ARGS='tests -k sigmoid_mul' the tests whose names match.
PYTEST_ARGS ?= tests
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup --durations=20 $(PYTEST_ARGS)

# Only what the demo runs (CMake's torchrr_demo; DEMO=cpp: and the C++ sample), not the tests,
# fuzzers and benchmarks that `make build` also builds.
build-demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target torchrr_demo $(if $(filter cpp,$(DEMO)),lora_step)
	@tools/install_into_venv.sh $(BUILD)

demo: build-demo
	@BUILD=$(BUILD) tools/demo.sh

bench: build
	@tools/bench.sh

# The trace reader's fuzzer for FUZZ_SECONDS (ctest's fuzz_reader_short runs at most 60); new
# inputs go to the build tree, never into the checked-in corpus.
FUZZ_SECONDS ?= 600
fuzz: build
	@test -x $(BUILD)/bin/fuzz_reader || { echo "fuzz_reader is not built: it needs clang with" \
	  "libFuzzer (install clang and libclang-rt-dev, then make build)"; exit 1; }
	mkdir -p $(BUILD)/tests/fuzz/corpus
	$(BUILD)/bin/fuzz_reader -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -rss_limit_mb=2048 \
	  -timeout=10 $(BUILD)/tests/fuzz/corpus tests/fuzz/corpus

# The source distribution that `pip install --no-build-isolation dist/torchrr-*.tar.gz` builds
# (pyproject.toml), written by scikit-build-core's own PEP 517 hook.
dist: setup
	$(PY) -c "from scikit_build_core.build import build_sdist; print('dist/' + build_sdist('dist'))"

clean:
	rm -rf $(BUILD)
