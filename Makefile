# gpuprof developer commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
CUPTI_WHEEL ?= nvidia-cuda-cupti==13.0.*
PYTEST_ARGS ?= -q

.PHONY: help venv build demo test test-gpu bench lint format asan valgrind docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "numpy>=2" "setuptools>=64" wheel pytest hypothesis "$(CUPTI_WHEEL)"

venv: $(VPY)  ## create .venv with the build and test dependencies

build: $(VPY)  ## build and install gpuprof into .venv (editable)
	GPUPROF_WERROR=1 $(VPY) -m pip install -q --no-build-isolation -e .

demo: build  ## profile the bundled training loop and print its table and diagnosis
	$(VPY) -m gpuprof demo

test: build  ## run the test suite (GPU tests skip without a GPU)
	$(VPY) -m pytest $(PYTEST_ARGS) tests

test-gpu: build  ## run only the GPU tests, failing if no GPU is usable
	GPUPROF_REQUIRE_GPU=1 $(VPY) -m pytest $(PYTEST_ARGS) -m gpu tests

bench: build  ## run the benchmarks side by side with peers
	$(VPY) benchmarks/bench_python_hook.py

lint:  ## ruff over the Python sources
	$(VPY) -m pip install -q ruff && $(VPY) -m ruff check python tests benchmarks

format:  ## format C with clang-format and Python with ruff
	clang-format -i csrc/*.c csrc/*.h cuda/*.c cuda/*.h
	$(VPY) -m ruff format python tests benchmarks

asan: $(VPY)  ## build with ASan+UBSan and run the CPU tests under it
	GPUPROF_SANITIZE=address,undefined $(VPY) -m pip install -q --no-build-isolation -e .
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	PYTHONMALLOC=malloc $(VPY) -m pytest $(PYTEST_ARGS) tests/unit
	$(VPY) -m pip install -q --no-build-isolation -e .

valgrind: build  ## memcheck a short profiling session
	PYTHONMALLOC=malloc valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
	  --show-leak-kinds=definite $(VPY) -c "import gpuprof; p = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]); p.start(); sum(range(1000)); p.stop(); print(p.key_averages().table(row_limit=5))"

docs:  ## the docs are Markdown under docs/
	@ls docs

clean:  ## remove build outputs
	rm -rf build *.egg-info python/*.egg-info python/gpuprof/*.so
