#!/usr/bin/env bash
# The GPU checks of issue 14 in one prepared run, for a lent GPU machine (no network there:
# cupy must already be importable).  Results go to $OUT (default ./gpu-out):
#   tests.txt       the GPU tests (kernels against xxhash on the device, DMA reads/writes under
#                   each verifier with a corrupt chunk refused, pipelined TCP reads into cupy,
#                   the GPU tier) and the CPU-side checksum/pipeline tests, verify forced to gpu
#   bench.txt/.json scripts/bench_gpu.py: get_into/put_from(cupy) with GPU and CPU
#                   verification, the pipelined TCP read, the pinned/pageable limits
# Usage: scripts/gpu_checks.sh [bench_gpu.py args, default: --repeat 20]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
"$PY" -c "import cupy; print('cupy', cupy.__version__, cupy.cuda.runtime.getDeviceCount(), 'device(s)')" \
    >> "$OUT/gpu.txt" 2>&1 || { cat "$OUT/gpu.txt"; echo "gpu_checks: cupy not usable here"; exit 2; }
cat "$OUT/gpu.txt"
MOONCAKE_GPU_VERIFY=gpu timeout 300 "$PY" -m pytest -q -p no:cacheprovider \
    tests/unit/test_xxh3_gpu.py tests/integration/test_gpu.py \
    tests/integration/test_recv_pipeline.py 2>&1 | tee "$OUT/tests.txt" | tail -15
tests_rc=${PIPESTATUS[0]}
[ $# -eq 0 ] && set -- --repeat 20
timeout 420 "$PY" scripts/bench_gpu.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "gpu_checks: tests rc=$tests_rc, bench rc=$bench_rc (results in $OUT)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
