#!/usr/bin/env bash
# One pass on a GPU machine: build in place, then the stages named in STAGES
# (space-separated; default "gputests bench"). Logs and JSON go to ${OUT:-out}/.
#
#   gputests   the gpu-marked tests (GPU_TESTS, default tests; GPU_T seconds)
#   bench      benchmarks/bench_gpu.py (BENCH_REPS, BENCH_ARGS: --workloads, --modes...)
#   launch     benchmarks/bench_launch.py, ns per launch (LAUNCH_REPS, LAUNCH_ARGS)
#   export     benchmarks/bench_export.py, gpuprof's trace export beside torch.profiler's
#   soak       benchmarks/soak_gpu.py for SOAK_S seconds, sessions cycled (SOAK_ARGS)
#   soak1      the same in one session
#   gpuasan    an ASan+UBSan copy of the extension (build/asan) under the CUDA tests
#   sanitizer  compute-sanitizer memcheck over CS_TESTS (CUPTI is unavailable under it)
#
#   STAGES="gputests export soak" OUT=/tmp/gpu bash scripts/gpu_check.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
stamp build
nvidia-smi -L > "$OUT/env.log" 2>&1
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "import gpuprof; print(gpuprof.cuda_status())" | tee -a "$OUT/env.log"
for s in ${STAGES:-gputests bench}; do
  stamp "$s"
  case $s in
    gputests)
      GPUPROF_REQUIRE_GPU=1 timeout "${GPU_T:-300}" python3 -m pytest -q -rA -m gpu \
        -p no:cacheprovider ${GPU_TESTS:-tests} > "$OUT/gpu_tests.log" 2>&1
      echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu_tests.log" | tail -60 ;;
    bench)
      timeout "${BENCH_T:-560}" python3 benchmarks/bench_gpu.py --reps "${BENCH_REPS:-5}" \
        --json "$OUT/bench_gpu.json" ${BENCH_ARGS:-} > "$OUT/bench_gpu.log" 2>&1
      tail -n "${BENCH_TAIL:-40}" "$OUT/bench_gpu.log" ;;
    launch)
      timeout "${LAUNCH_T:-240}" python3 benchmarks/bench_launch.py --reps "${LAUNCH_REPS:-7}" \
        --json "$OUT/bench_launch.json" ${LAUNCH_ARGS:-} > "$OUT/bench_launch.log" 2>&1
      tail -n 25 "$OUT/bench_launch.log" ;;
    export)
      timeout 240 python3 benchmarks/bench_export.py --steps 200 --json "$OUT/bench_export.json" \
        2>&1 | tee "$OUT/bench_export.log" ;;
    soak|soak1)
      extra=${SOAK_ARGS:-}; [ "$s" = soak1 ] && extra="--session-steps 100000000"
      timeout $(( ${SOAK_S:-60} + 60 )) python3 benchmarks/soak_gpu.py --seconds "${SOAK_S:-60}" \
        --json "$OUT/$s.json" $extra 2>&1 | tee "$OUT/$s.log" ;;
    gpuasan)
      rm -rf build/asan && mkdir -p build/asan/reports
      GPUPROF_SANITIZE=address,undefined python3 setup.py -q build --build-base build/asan \
        --build-lib build/asan/lib > "$OUT/asan_build.log" 2>&1 || tail -20 "$OUT/asan_build.log"
      LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
      ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:alloc_dealloc_mismatch=0:log_path=$PWD/build/asan/reports/asan \
      UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONMALLOC=malloc \
      PYTHONPATH=$PWD/build/asan/lib GPUPROF_UNDER_SANITIZER=1 GPUPROF_REQUIRE_GPU=1 \
        timeout "${ASAN_T:-200}" python3 -m pytest -q -rfE -m gpu -p no:cacheprovider \
        ${ASAN_TESTS:-tests/gpu/test_cuda_capture.py tests/gpu/test_memory_gpu.py tests/gpu/test_nvtx_gpu.py tests/unit/test_hostile.py} \
        > "$OUT/gpu_asan.log" 2>&1
      echo "rc=$?"; tail -15 "$OUT/gpu_asan.log"
      cat build/asan/reports/* 2>/dev/null | tee "$OUT/asan_reports.txt" | head -40 ;;
    sanitizer)
      CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      GPUPROF_REQUIRE_GPU=1 timeout "${CS_T:-150}" "$CS" --tool memcheck --target-processes all \
        --error-exitcode 9 --print-limit 20 python3 -m pytest -q -m gpu -p no:cacheprovider \
        ${CS_TESTS:-tests/gpu/test_cuda_capture.py} > "$OUT/sanitizer.log" 2>&1
      echo "rc=$?"; grep -E "ERROR SUMMARY|========= |passed|failed" "$OUT/sanitizer.log" | tail -30 ;;
    *) echo "unknown stage $s" ;;
  esac
done
stamp done
