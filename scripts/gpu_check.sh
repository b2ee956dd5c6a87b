#!/usr/bin/env bash
# One pass on a GPU machine: build in place, run the GPU tests, a smoke
# profile and the GPU benchmark. Writes logs under ${OUT:-out}/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
{
  nvidia-smi -L; ls /dev/nvidia* 2>&1 | head -3; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  python3 setup.py build_ext --inplace 2>&1 | grep -E "error|warning:|gpuprof:"
  python3 -c "import gpuprof; print(gpuprof.cuda_status())"
} 2>&1 | tee "$OUT/env.log"
python3 -m pytest -q -x tests/unit 2>&1 | tail -3 | tee "$OUT/unit.log"
GPUPROF_REQUIRE_GPU=1 timeout ${GPU_TEST_TIMEOUT:-300} python3 -m pytest -v -s -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -80
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_gpu.py --steps ${BENCH_STEPS:-200} --json "$OUT/bench_gpu.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_gpu.log"
fi
