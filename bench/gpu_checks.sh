#!/bin/bash
# The GPU checks of issue 29 in one device call (run from the repository root;
# results under $OUT). Wheels the image lacks (qwix, ml_collections,
# tensorboardX) travel in .whl/ (bench/README.md, "GPU figures").
#   bash bench/gpu_checks.sh kernel   # the kernel's tests, bench/decode.py, int8 GEMM tests
#   bash bench/gpu_checks.sh plans    # the kernel's launch plans (bench/paged_kernel.py:
#                                     # 48 page-gather and 8 slot-gather plans at full fill,
#                                     # the best at every fill), ~3 min
#   bash bench/gpu_checks.sh sampler  # the sampler table with PLAN=... (else the best of a
#                                     # 4-plan sweep), the tests on the GPU
#   bash bench/gpu_checks.sh verify   # the kernel's comparison tests, the native-vs-emulated
#                                     # gap (bench/native_gap.py), FP8 weights at a 1.7B shape
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  uptime; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
case "${1:-kernel}" in
  kernel)
    JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_kv_cache.py \
      -k "pallas or in_place or auto" 2>&1 | tail -25 > "$OUT/tests_kv_cache.txt"
    tail -3 "$OUT/tests_kv_cache.txt"
    timeout 150 python3 bench/decode.py --rows 64 --slots 2048 --prompt 1024 \
      --preset qwen3_0p6b --dtype bfloat16 --json "$OUT/decode_bf16.json" \
      > "$OUT/decode_bf16.md" 2>&1
    tail -12 "$OUT/decode_bf16.md"
    timeout 100 python3 bench/decode.py --rows 64 --slots 2048 --prompt 1024 \
      --preset qwen3_0p6b --dtype bfloat16 --kv_cache_dtype fp8 --impls pallas,paged \
      --json "$OUT/decode_fp8kv.json" > "$OUT/decode_fp8kv.md" 2>&1
    tail -8 "$OUT/decode_fp8kv.md"
    JAX_PLATFORMS=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_native_quant.py 2>&1 \
      | tail -25 > "$OUT/tests_native_quant.txt"
    tail -3 "$OUT/tests_native_quant.txt"
    ;;
  plans)
    timeout 330 python3 bench/paged_kernel.py --json "$OUT/paged_kernel.json" \
      > "$OUT/paged_kernel.md" 2> "$OUT/paged_kernel.log"
    cat "$OUT/paged_kernel.md"; tail -3 "$OUT/paged_kernel.log"
    ;;
  sampler)
    best=${PLAN:-}
    if [ -z "$best" ]; then
      rm -f "$OUT/paged_kernel.json"
      timeout 100 python3 bench/paged_kernel.py --ppb 1 --splits 4,8 --warps 4 --stages 2,3 \
        --json "$OUT/paged_kernel.json" > "$OUT/paged_kernel.md" 2> "$OUT/paged_kernel.log"
      cat "$OUT/paged_kernel.md"
      best=$(python3 -c "import json; print(json.load(open('$OUT/paged_kernel.json')).get('best_plan', ''))" 2>/dev/null)
    fi
    [ -z "$best" ] && echo "no plan measured: the sampler runs the default plan"
    echo "plan: ${best:-default}" > "$OUT/plan.txt"
    MIPU_PALLAS_DECODE_PLAN=$best \
    timeout "${SAMPLER_TIMEOUT:-220}" python3 bench/accelerator.py --parts sampler \
      --sampler_modes "${MODES:-bf16,bf16 + fp8 KV,bf16 paged XLA}" --out "$OUT/accelerator" \
      > "$OUT/accelerator.log" 2>&1
    tail -5 "$OUT/accelerator.log"; cat "$OUT/accelerator/accelerator.md"
    # The tests on the GPU (tests/conftest.py defaults JAX_PLATFORMS to cpu).
    JAX_PLATFORMS=cuda timeout 130 python3 -m pytest -q -p no:cacheprovider \
      tests/test_native_quant.py tests/test_kv_cache.py -k "not sample_the_same" 2>&1 \
      | tail -25 > "$OUT/tests_gpu.txt"
    tail -4 "$OUT/tests_gpu.txt"
    ;;
  verify)
    JAX_PLATFORMS=cuda timeout 90 python3 -m pytest -v -p no:cacheprovider tests/test_kv_cache.py \
      -k "not sample_the_same" 2>&1 | tail -40 > "$OUT/tests_kv_cache.txt"
    tail -3 "$OUT/tests_kv_cache.txt"
    timeout 110 python3 bench/native_gap.py --json "$OUT/native_gap.json" 2>&1 \
      | grep -v Warn > "$OUT/native_gap.txt"
    cat "$OUT/native_gap.txt"
    timeout 210 python3 bench/accelerator.py --preset qwen3_1p7b --parts sampler \
      --sampler_modes "bf16,fp8 native" --sampler_seqs 16 --sampler_prompt 256 \
      --sampler_new 256 --dump_hlo /tmp/hlo17 --out "$OUT/accelerator_1p7b" \
      > "$OUT/accelerator_1p7b.log" 2>&1
    tail -3 "$OUT/accelerator_1p7b.log"; cat "$OUT/accelerator_1p7b/accelerator.md"
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 80 python3 bench/native_gap.py \
      --json "$OUT/native_gap_no_triton.json" 2>&1 | grep -v Warn > "$OUT/native_gap_no_triton.txt"
    cat "$OUT/native_gap_no_triton.txt"
    JAX_PLATFORMS=cuda timeout 70 python3 -m pytest -v -p no:cacheprovider tests/test_native_quant.py \
      -k "log_probs or untied or lowered" 2>&1 | tail -30 > "$OUT/tests_native_quant.txt"
    tail -12 "$OUT/tests_native_quant.txt"
    ;;
  int4)  # after the FP8 barrier fix: the native-vs-emulated tests and the gap again
    JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -v --tb=short -p no:cacheprovider \
      tests/test_native_quant.py -k "barrier or int4_values or log_probs or untied" 2>&1 \
      | tail -60 > "$OUT/tests_native_quant.txt"
    grep -E "PASS|FAIL|Error|assert|Mismatch|Max abs" "$OUT/tests_native_quant.txt" | head -40
    timeout 100 python3 bench/native_gap.py --precisions highest --json "$OUT/native_gap.json" \
      2>&1 | grep -v Warn > "$OUT/native_gap.txt"
    cat "$OUT/native_gap.txt"
    ;;
esac
