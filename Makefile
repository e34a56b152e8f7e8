# Crucible's front door. A new user needs two commands:
#   make demo   install what is missing, build, and run the main job end to end
#   make test   install what is missing, build, and run every test
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
VENV := .venv
PYTHON := $(VENV)/bin/python

.PHONY: all build build-mpich deps demo-deps demo-build venv current-env llama-env test unit-test py-test test-gpu gpu-pack demo demo-post demo-rl bench clean format asan

all: build

# Debian packages (skipped when already installed), then the project venv.
deps:
	@scripts/install-deps.sh

venv: $(VENV)/.stamp
$(VENV)/.stamp: scripts/requirements-test.txt scripts/setup-venv.sh
	@scripts/setup-venv.sh $(VENV)
	@touch $@

# The "current" test environment: today's releases of torch, transformers, lm-eval, megatron-core
# (scripts/requirements-current.txt), for the interop and reference tests. A venv outside the
# clone (~/.cache/crucible/venv-current-<key>, about 6 GB), built once per requirements change.
current-env: deps
	@scripts/setup-current.sh >/dev/null

# The llama.cpp test environment: llama-cpp-python (llama.cpp compiled from source for the CPU,
# x86-64-v3, minutes on 2 cores) and the gguf package (scripts/requirements-llama.txt), for the
# GGUF export tests. A venv outside the clone (~/.cache/crucible/venv-llama-<key>), built once.
llama-env: deps
	@scripts/setup-llama-cpp.sh >/dev/null

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

# A build folder that `make demo` configured without the tests gets them back here.
build: deps $(BUILD)/build.ninja
	@if grep -qs '^CRUCIBLE_TESTS:BOOL=OFF' $(BUILD)/CMakeCache.txt; then \
	  cmake -S . -B $(BUILD) -DCRUCIBLE_TESTS=ON > /dev/null; fi
	cmake --build $(BUILD) -j $(JOBS)

# The crucible binary built against MPICH instead of Open MPI, and the communicator tests of
# tests/mpi/ (tests/integration/test_mpich.py); without the CUDA backend, which $(BUILD) compiles.
MPICH_BUILD ?= build-mpich
$(MPICH_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(MPICH_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCRUCIBLE_MPI=mpich \
	  -DCRUCIBLE_CUDA=OFF

build-mpich: deps $(MPICH_BUILD)/build.ninja
	cmake --build $(MPICH_BUILD) -j $(JOBS) --target crucible test_mpi

unit-test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

py-test: build build-mpich venv current-env llama-env
	CRUCIBLE=$(abspath $(BUILD))/crucible CRUCIBLE_MPICH=$(abspath $(MPICH_BUILD))/crucible \
	  $(PYTHON) -m pytest -q tests/integration

test: unit-test py-test

# The GPU tests (tests/gpu/, a build with the CUDA backend): every kernel and a whole model step
# against the CPU; without a GPU they are skipped in one line. On a lent GPU machine, run
# scripts/gpu-check.sh (it unpacks what `make gpu-pack` built here).
test-gpu: build
	$(BUILD)/test_gpu

gpu-pack: build
	scripts/pack-gpu-build.sh $(BUILD) gpu-pack

# `make demo` installs only what the demo needs (the compiler and the libraries `crucible` links;
# no test frameworks, schedulers or torch) and builds only the `crucible` program, each phase in
# one line with its log file.
demo-deps:
	@scripts/install-deps.sh --demo

demo-build: demo-deps
	@scripts/quiet-build.sh $(BUILD)

demo: demo-build
	@scripts/demo.sh

# `make demo-post`: from pre-training to a chat model (CPT rewarm vs gentle, SFT, generate --chat),
# with what `make demo` installs and builds (docs/post-training.md "Worked path").
demo-post: demo-build
	@scripts/demo-post.sh

# `make demo-rl`: reinforcement learning on arithmetic (pre-training, SFT, GRPO on sum_digits,
# held-out accuracy before and after), with what `make demo` builds (docs/post-training.md).
demo-rl: demo-build
	@scripts/demo-rl.sh

bench: build venv current-env
	CRUCIBLE=$(abspath $(BUILD))/crucible $(PYTHON) bench/train_vs_torch.py

asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUCIBLE_SANITIZE=ON \
	  -DCRUCIBLE_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'bench/*.cc')

clean:
	rm -rf $(BUILD) $(MPICH_BUILD) build-asan
