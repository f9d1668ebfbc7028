# torchrr: the two commands are `make demo` and `make test`. Each sets up what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
PY := .venv/bin/python
CMAKE_FLAGS ?=

.PHONY: all setup configure build test demo bench fuzz clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(PY) -m pytest -q tests

demo: build
	@tools/demo.sh

bench: build
	@tools/bench.sh

clean:
	rm -rf $(BUILD)
