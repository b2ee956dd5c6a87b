# gpuprof developer commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
CUPTI_WHEEL ?= nvidia-cuda-cupti==13.0.*
PYTEST_ARGS ?= -q

# PyTorch's CPU build (a pinned version), for the command-line tests on real training scripts
TORCH ?= torch==2.13.0

.PHONY: help venv frameworks build demo test test-slow test-python test-gpu bench lint lint-tools format asan valgrind docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "numpy>=2" "setuptools>=64" wheel pytest hypothesis "$(CUPTI_WHEEL)"

venv: $(VPY)  ## create .venv with the build and test dependencies

# Every install names $(TORCH), so that Lightning or transformers cannot bring
# another PyTorch: pip fails instead. transformers is optional (its test skips).
frameworks: $(VPY)  ## add PyTorch (CPU), Lightning and transformers to .venv for tests/cli
	$(VPY) -m pip install -q "$(TORCH)"
	$(VPY) -m pip install -q "$(TORCH)" lightning
	$(VPY) -m pip install -q "$(TORCH)" transformers accelerate \
	  || echo "transformers not installed: its test will skip"
	$(VPY) -c "import torch, lightning; v = torch.__version__.split('+')[0]; \
	  assert '$(TORCH)'.endswith('==' + v), 'expected $(TORCH), got torch ' + torch.__version__; \
	  print('frameworks: torch', torch.__version__, '(CUDA' if torch.version.cuda else '(CPU', \
	        'build), lightning', lightning.__version__)"

build: $(VPY)  ## build and install gpuprof into .venv (editable)
	GPUPROF_WERROR=1 $(VPY) -m pip install -q --no-build-isolation -e .

demo: build  ## profile the bundled training loop and print its table and diagnosis
	$(VPY) -m gpuprof demo

# Tests marked slow (tens of seconds each) are left out of `make test`; `make test-slow`
# runs them, and CI runs both.
test: build  ## run the test suite, less the slow tests (GPU tests skip without a GPU)
	$(VPY) -m pytest $(PYTEST_ARGS) -m "not slow" tests

test-slow: build  ## run only the tests marked slow
	$(VPY) -m pytest $(PYTEST_ARGS) -m slow tests

# The unit tests on another CPython (PY=python3.12) in its own venv (.venv-py), with the
# extension built in place beside the default one (their file names differ by ABI tag):
# once with the default hook backend (sys.monitoring from 3.12) and once with the
# profile-function one.
test-python:  ## run tests/unit on another CPython: make test-python PY=python3.12
	@test -n "$(PY)" || { echo "make test-python: name the interpreter, e.g. PY=python3.12"; exit 2; }
	rm -rf .venv-py && $(PY) -m venv .venv-py
	.venv-py/bin/python -m pip install -q "numpy>=2" "setuptools>=64" wheel pytest hypothesis "$(CUPTI_WHEEL)"
	GPUPROF_WERROR=1 .venv-py/bin/python setup.py -q build_ext --inplace
	PYTHONPATH=$(CURDIR)/python .venv-py/bin/python -m pytest $(PYTEST_ARGS) tests/unit
	GPUPROF_HOOK=setprofile PYTHONPATH=$(CURDIR)/python .venv-py/bin/python -m pytest $(PYTEST_ARGS) tests/unit

test-gpu: build  ## run only the GPU tests, failing if no GPU is usable
	GPUPROF_REQUIRE_GPU=1 $(VPY) -m pytest $(PYTEST_ARGS) -m gpu tests

bench: build  ## run the benchmarks side by side with peers
	$(VPY) benchmarks/bench_python_hook.py

# The C style is .clang-format's; ruff, clang-format and mypy come from PyPI at pinned
# versions (the clang-format wheel), so that every machine formats and checks alike.
C_SOURCES = csrc/*.c csrc/*.h csrc/*/*.c csrc/*/*.h cuda/*.c cuda/*.h
LINT_TOOLS = "ruff==$(RUFF_VERSION)" "clang-format==$(CLANG_FORMAT_VERSION)" "mypy==$(MYPY_VERSION)"
CLANG_FORMAT_VERSION ?= 23.1.5
RUFF_VERSION ?= 0.17.6
MYPY_VERSION ?= 2.4.1

lint-tools: $(VPY)
	$(VPY) -m pip install -q $(LINT_TOOLS)

# mypy reads its settings (the files, the strict public API) from pyproject.toml.
lint: lint-tools  ## ruff check, ruff format --check, clang-format --dry-run and mypy (what CI runs)
	$(VPY) -m ruff check python tests benchmarks
	$(VPY) -m ruff format --check python tests benchmarks
	$(VENV)/bin/clang-format --dry-run -Werror $(C_SOURCES)
	$(VPY) -m mypy

format: lint-tools  ## format C with clang-format and Python with ruff
	$(VENV)/bin/clang-format -i $(C_SOURCES)
	$(VPY) -m ruff format python tests benchmarks

# `make asan` builds a second copy of the package into build/asan (the in-place
# build is untouched) with ASan+UBSan, and runs tests/unit against it. Every
# process writes its ASan reports to build/asan/reports, so a report from a
# subprocess or a forked child fails the target even when its test passed.
# UBSan (which ignores log_path when ASan is loaded) reports on stderr and
# halts the process with exit status 1.
ASAN_DIR := build/asan
SAN_ENV = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:log_path=$(CURDIR)/$(ASAN_DIR)/reports/asan \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	PYTHONMALLOC=malloc PYTHONPATH=$(CURDIR)/$(ASAN_DIR)/lib GPUPROF_UNDER_SANITIZER=1 \
	GPUPROF_SUBPROCESS_TIMEOUT_S=10
# (children under the sanitizers take several times longer to answer the parent)
# gcc 12's ASan runtime does not lock its allocator around fork(): a child forked
# while another thread is inside malloc without the GIL (thread start or exit,
# I/O) can deadlock. The run is time-limited so such a hang fails, and says so; the
# limit is 1.5x the slowest whole run seen on CI's machine (407 s, December 2026).
ASAN_TIMEOUT ?= 600
# Not run under it: measurements a sanitizer distorts, RSS (ASan's quarantine,
# shadow memory, untouched calloc pages) and wall-clock shares (a 2-5x slowdown, under
# which a worker's one-off, such as reading a source file for a warning, can outweigh
# its 80 ms of planted work); and CUPTI's host profiler API, whose libnvperf_host.so
# is dlopen'ed with RTLD_DEEPBIND, which the sanitizer runtime refuses
# (google/sanitizers#611).
ASAN_SKIP ?= memory_stays_flat_over_10000_steps or host_curve_rises_with_a_200mb_allocation \
	or workers_hottest_function or data_stall_names_the_workers_function \
	or every_metric_exists_on_every_chip

asan: $(VPY)  ## build a second copy with ASan+UBSan (build/asan) and run tests/unit under it
	rm -rf $(ASAN_DIR)/lib $(ASAN_DIR)/reports && mkdir -p $(ASAN_DIR)/reports
	GPUPROF_WERROR=1 GPUPROF_SANITIZE=address,undefined $(VPY) setup.py -q build \
	  --build-base $(ASAN_DIR) --build-lib $(ASAN_DIR)/lib
	$(SAN_ENV) $(VPY) -c "import gpuprof, sys; sys.exit(not gpuprof.__file__.startswith('$(CURDIR)/$(ASAN_DIR)/'))"
	$(SAN_ENV) timeout -k 10 $(ASAN_TIMEOUT) $(VPY) -m pytest $(PYTEST_ARGS) -p no:cacheprovider \
	  -k "not ($(ASAN_SKIP))" tests/unit; \
	rc=$$?; [ $$rc -ne 124 ] || echo "make asan: tests/unit did not finish in $(ASAN_TIMEOUT) s"; \
	if [ -n "$$(ls -A $(ASAN_DIR)/reports)" ]; then \
	  cat $(ASAN_DIR)/reports/*; echo "make asan: sanitizer reports above (in $(ASAN_DIR)/reports)"; exit 1; \
	fi; exit $$rc

# A short session under memcheck: benchmarks/soak.py with threads, a repeating
# schedule and a table per window. CPython, numpy and ld.so have errors and
# leaks of their own under memcheck; the target fails on those whose stack
# passes through gpuprof's extension (invalid accesses, uninitialised values,
# definite leaks) and prints them.
VALGRIND_STEPS ?= 300
VALGRIND_XML := build/valgrind.xml
define VALGRIND_CHECK
import sys, xml.etree.ElementTree as ET
errs = list(ET.parse(sys.argv[1]).getroot().iter("error"))
ours = [e for e in errs if any("_gpuprof" in (o.text or "") for o in e.iter("obj"))]
for e in ours:
    print(e.findtext("kind"), e.findtext("what") or e.findtext("xwhat/text"))
    for f in e.iter("frame"):
        print("    ", f.findtext("fn"), f.findtext("file") or f.findtext("obj"), f.findtext("line") or "")
print(f"make valgrind: {len(errs)} memcheck errors and definite leaks, {len(ours)} in gpuprof's code")
sys.exit(1 if ours else 0)
endef
export VALGRIND_CHECK
valgrind: build  ## memcheck a short profiling session; fails on errors and definite leaks in gpuprof
	mkdir -p build
	PYTHONMALLOC=malloc valgrind -q --leak-check=full --show-leak-kinds=definite \
	  --errors-for-leak-kinds=definite --num-callers=40 --xml=yes --xml-file=$(VALGRIND_XML) \
	  $(VPY) benchmarks/soak.py --steps $(VALGRIND_STEPS) --threads 2 --json /dev/null
	$(VPY) -c "$$VALGRIND_CHECK" $(VALGRIND_XML)

docs:  ## the docs are Markdown under docs/
	@ls docs

clean:  ## remove build outputs
	rm -rf build *.egg-info python/*.egg-info python/gpuprof/*.so
