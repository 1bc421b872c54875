#!/bin/bash
# The GPU checks in one device call (run from the repository root;
# results under $OUT). Wheels the image lacks (qwix, ml_collections,
# tensorboardX) travel in .whl/ (bench/README.md, "GPU figures").
#   bash bench/gpu_checks.sh kernel   # the kernel's tests, bench/perf/decode.py, int8 GEMM tests
#   bash bench/gpu_checks.sh plans    # the kernel's launch plans (bench/gpu/paged_kernel.py:
#                                     # 48 page-gather and 8 slot-gather plans at full fill,
#                                     # the best at every fill), ~3 min
#   bash bench/gpu_checks.sh sampler  # the sampler table with PLAN=... (else the best of a
#                                     # 4-plan sweep), the tests on the GPU
#   bash bench/gpu_checks.sh verify   # the kernel's comparison tests, the native-vs-emulated
#                                     # gap (bench/probes/native_gap.py), FP8 weights at a 1.7B shape
#   bash bench/gpu_checks.sh followup # after a window: true on-policy under XLA flag sets, the GPU
#                                     # tests in full, the math run at 512 new tokens
#   bash bench/gpu_checks.sh window   # the accelerator window: everything below in order of
#                                     # value within BUDGET seconds (default 420), each part
#                                     # under its own timeout; TINY=1 smoke-runs it on a CPU
#   bash bench/gpu_checks.sh window2  # the second window (bench/README.md, "The second
#                                     # window"): the decode step's profile, the launch plans,
#                                     # XLA paged and dense, true on-policy's price, the tests
#                                     # left unrun, the main job, MoE; BUDGET and TINY as above
set -u
# The suite's default leaves out the extended tests (setup.cfg); on a device they are
# what these checks are for (the kernels compiled, the true on-policy loop).
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -m 'not multiprocess and not campaign'"
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
else
  echo "no wheels in .whl/: using the installed packages"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  date -u; uptime; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

START=$(date +%s)
# pack NAME: $OUT into $DEST/NAME; a log that another part is still writing is taken as
# it stands (tar's "file changed as we read it", status 1), a failed pack removed.
pack() {
  tar --warning=no-file-changed -czf "$DEST/$1" -C "$OUT" . || [ $? -eq 1 ] \
    || { rm -f "$DEST/$1"; return 1; }
}
# part NAME MAX_SECONDS CMD...: runs CMD under min(MAX_SECONDS x SCALE, what is left of
# BUDGET), output in $OUT/NAME.log, its status and time in $OUT/window.txt; skipped under 30 s
# left; killed 15 s after its limit if it has not stopped.
part() {
  local name=$1 max=$(( $2 * ${SCALE:-1} )); shift 2
  local left=$(( ${BUDGET:-420} - ($(date +%s) - START) ))
  if [ "$left" -lt 30 ]; then
    echo "$name: skipped, ${left} s of the budget left" | tee -a "$OUT/window.txt"; return
  fi
  local t=$(( max < left ? max : left )) t0=$(date +%s)
  timeout -k 15 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s (limit $t s)" | tee -a "$OUT/window.txt"
  tail -4 "$OUT/$name.log"
  # The device brings back at most 8 files: everything so far, packed after each part.
  if [ -n "${DEST:-}" ]; then
    local tgz=${DEST_TGZ:-window.tgz}
    pack "$tgz.$BASHPID" && mv "$DEST/$tgz.$BASHPID" "$DEST/$tgz"
    cp "$OUT/window.txt" "$OUT/env.txt" "$DEST/"
  fi
}

case "${1:-kernel}" in
  window)
    if [ -n "${TINY:-}" ]; then
      acc=(--tiny); export JAX_PLATFORMS=cpu; collect=(--co)   # the CPU smoke run
    else
      acc=(); export JAX_PLATFORMS=cuda; collect=()
    fi
    DEST=$OUT; OUT=$(mktemp -d); cp "$DEST/env.txt" "$OUT/"   # packed into $DEST/window.tgz
    # The sampler against its bound, Qwen3-0.6B, 64 x (1,024 + 1,024): bf16, FP8 KV.
    part sampler_0p6b 170 python3 -m bench.gpu.accelerator "${acc[@]}" --parts sampler \
      --sampler_modes "bf16,bf16 + fp8 KV" --out "$OUT/sampler_0p6b"
    # The weight-bound shape, Qwen3-1.7B, 16 x (256 + 256): bf16 against FP8 native weights.
    part sampler_1p7b 130 python3 -m bench.gpu.accelerator "${acc[@]}" --preset qwen3_1p7b \
      --parts sampler --sampler_modes "bf16,fp8 native" --sampler_seqs 16 \
      --sampler_prompt 256 --sampler_new 256 --out "$OUT/sampler_1p7b"
    # studies/configs/math.py for 2 RL steps on a random Qwen3-0.6B checkpoint, phases by the
    # loop's timers (512 new tokens: 150 s on an H200; its metrics kept if it runs out of time).
    rm -rf /tmp/window_math  # a run left there would be resumed, not measured
    part math 170 python3 -m bench.gpu.accelerator "${acc[@]}" --parts math --math_max_new 512 \
      --math_eval_problems 1 --math_workdir /tmp/window_math --out "$OUT/math"
    cp /tmp/window_math/run/*.jsonl "$OUT/" 2>/dev/null
    # The GPU tests (true on-policy's bitwise check among them), the files side by side
    # (compiling is CPU work), each test under its own limit where pytest-timeout is there.
    per_test=(); python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 60)
    # (test_losses_policy: the bf16 Adam moment's rounding survives XLA's GPU compiler.)
    for f in test_kv_cache test_gpu_decode_fallback test_native_quant test_sampler_scale \
        test_true_on_policy test_losses_policy; do
      part "$f" 130 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -rxXfs \
        -p no:cacheprovider "${per_test[@]}" "${collect[@]}" "tests/$f.py" &
    done
    wait
    part true_on_policy 100 python3 -m bench.perf.true_on_policy ${TINY:+--tiny} \
      --json "$OUT/true_on_policy.json"
    # If time is left: the XLA paged path beside the kernel, then the launch-plan sweep.
    part sampler_xla 70 python3 -m bench.gpu.accelerator "${acc[@]}" --parts sampler \
      --sampler_modes "bf16 paged XLA" --out "$OUT/sampler_xla"
    [ -z "${TINY:-}" ] && part plans 120 python3 -m bench.gpu.paged_kernel \
      --json "$OUT/paged_kernel.json"
    echo "window: $(( $(date +%s) - START )) s of ${BUDGET:-420}" | tee -a "$OUT/window.txt"
    pack window.tgz; cp "$OUT/window.txt" "$DEST/"
    ;;
  window2)
    # Each part in order of value, under its own limit; 5 and 6 (tests, the main job) side by
    # side: neither is a device timing. TINY=1: tiny shapes on the CPU, the tests collected.
    if [ -n "${TINY:-}" ]; then  # a loaded 2-core CPU: twice each part's limit
      export JAX_PLATFORMS=cpu; tiny=(--tiny); collect=(--co); SCALE=${SCALE:-2}
      kernel=(--rows 4 --slots 256 --page 16 --kv_heads 2 --heads 4 --head_dim 32 --layers 2
              --ppb 1,2 --splits 2 --warps 4 --stages 2 --slot_plans 32,2,4,2 --calls 2
              --repeats 1 --sweep_fills 256,32)
      decode=(--rows 8 --slots 256 --prompt 64 --preset tiny --page_size 16 --repeats 2)
      compare=(--quick)
    else
      export JAX_PLATFORMS=cuda; tiny=(); collect=()
      kernel=(--ppb 1,2 --splits 4,2,8,16 --warps 4,8 --stages 2,3
              --slot_plans "64,4,4,2;64,4,4,3;64,8,4,2;32,8,4,2" --sweep_fills 2048,256)
      decode=(--rows 64 --slots 2048 --prompt 1024 --preset qwen3_0p6b --dtype bfloat16)
      compare=()
    fi
    export XLA_PYTHON_CLIENT_PREALLOCATE=false  # parts 5 and 6 share the device
    DEST=$OUT; OUT=$(mktemp -d); cp "$DEST/env.txt" "$OUT/"   # packed into $DEST/window2.tgz
    DEST_TGZ=window2.tgz
    # 1. One decode step profiled (Qwen3-0.6B, 64 x (1,024 + 1,024), rows at 1,536 slots),
    #    bf16 and FP8 KV: its kernels by class against the step and its byte bound.
    part profile 100 python3 -m bench.gpu.decode_profile "${tiny[@]}" --out "$OUT/profile"
    # 2. The kernel's launch plans at full and 1/8 fill, bf16 then FP8 pools, each against a
    #    read of its bytes; prints the MEASURED_PLANS row of the best.
    part plans_bf16 75 python3 -m bench.gpu.paged_kernel "${kernel[@]}" --max_seconds 50 \
      --json "$OUT/plans_bf16.json"
    part plans_fp8 70 python3 -m bench.gpu.paged_kernel "${kernel[@]}" --kv_dtype fp8 \
      --max_seconds 45 --json "$OUT/plans_fp8.json"
    # 3. The decode step per attention: the kernel, the XLA paged path, the dense cache.
    part decode_attention 80 python3 -m bench.perf.decode "${decode[@]}" \
      --impls pallas,paged,dense --json "$OUT/decode_attention.json"
    # 4. The true on-policy mode's price, bf16: sampler and learner step, mode on / off.
    part true_on_policy 60 python3 -m bench.perf.true_on_policy ${TINY:+--tiny} \
      --dtype bfloat16 --json "$OUT/true_on_policy.json"
    # 5. The tests the first window left unrun (pytest-timeout's thread method dumps every
    #    thread's stack at the limit: a hang or a slow compile), beside 6.
    per_test=(); python3 -c "import pytest_timeout" 2>/dev/null \
      && per_test=(-o timeout=75 -o timeout_method=thread)
    pt=(python3 -m pytest -v -rxXfs -p no:cacheprovider "${per_test[@]}" "${collect[@]}")
    part tests_int4 90 "${pt[@]}" \
      "tests/test_native_quant.py::test_native_log_probs_equal_emulated[int4-None-True]" &
    part tests_kv_cache 90 "${pt[@]}" \
      tests/test_kv_cache.py::test_decode_attention_auto_is_a_kernel_on_a_gpu_or_a_tpu \
      tests/test_kv_cache.py::test_paged_cache_write_lands_at_the_page_table_slots \
      tests/test_kv_cache.py::test_paged_and_dense_decode_sample_the_same_in_float32 &
    part tests_true_on_policy 90 "${pt[@]}" \
      tests/test_true_on_policy.py::test_default_bf16_is_not_bitwise \
      tests/test_true_on_policy.py::test_refusals \
      tests/test_true_on_policy.py::test_rl_loop_logs_no_mismatch \
      tests/test_true_on_policy.py::test_float32_on_a_gpu_warns &
    # 6. The main job as the README gives it (its install aside: mipu_jax is on PYTHONPATH),
    #    timed; cut at its limit, its log's progress bar says how far it got.
    rm -rf /tmp/window2_compare
    part compare 100 python3 -m experiments.compare --workdir /tmp/window2_compare \
      "${compare[@]}" &
    wait
    cp /tmp/window2_compare/table.md "$OUT/compare_table.md" 2>/dev/null
    # 7. MoE: a reduced Qwen3-30B-A3B (2 layers): one expert matmul per grouped-matmul
    #    implementation, then the learner step and the sampler with each.
    part moe 120 python3 -m bench.gpu.moe_step "${tiny[@]}" --json "$OUT/moe.json"
    echo "window2: $(( $(date +%s) - START )) s of ${BUDGET:-420}" | tee -a "$OUT/window.txt"
    pack window2.tgz; cp "$OUT/window.txt" "$DEST/"
    # The figures in the call's own output too, in case its files do not come back.
    echo "=== summary"; cat "$OUT/window.txt"
    grep -h -A1 "MEASURED_PLANS row" "$OUT"/plans_*.log 2>/dev/null
    classes="attention|qkv|output|MLP|LM head|sampling|cache|copies|other|\*\*kernels|measured|step"
    grep -h -E "^## |^step |^\| ($classes)" "$OUT/profile/profile.md" 2>/dev/null
    grep -h -E "^\| [0-9.]+ \(|step at" "$OUT/decode_attention.log" 2>/dev/null
    grep -h -E "passed|failed|error|Timeout|xfail" "$OUT"/tests_*.log 2>/dev/null | tail -8
    tail -3 "$OUT/compare.log" 2>/dev/null; tail -12 "$OUT/moe.log" 2>/dev/null
    ;;
  followup)
    # After a window: the true on-policy comparison under XLA flag sets, the GPU tests in
    # full (in parallel: compiling is CPU work), then the math run at a smaller size.
    DEST=$OUT; OUT=$(mktemp -d); cp "$DEST/env.txt" "$OUT/"
    export JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false
    flags() {  # flags NAME XLA_FLAGS [pytest -k]
      XLA_FLAGS="$2" timeout 110 python3 -m pytest -q -rxXfs -p no:cacheprovider \
        tests/test_true_on_policy.py ${3:+-k "$3"} > "$OUT/tp_$1.log" 2>&1
      echo "tp_$1 ($2): rc $?" >> "$OUT/window.txt"
    }
    k="sampler_equals_the_loss_forward or packed_rows or bf16_rows_differ"
    nu=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_NO_UNROLL
    flags default "" &
    flags cublas "--xla_gpu_enable_triton_gemm=false" "$k" &
    flags noautotune "--xla_gpu_autotune_level=0" "$k" &
    flags nounroll "$nu" "$k" &
    flags all3 "--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0 $nu" "$k" &
    JAX_DEFAULT_MATMUL_PRECISION=highest flags highest "" "$k" &
    for f in test_kv_cache test_sampler_scale test_native_quant; do
      ( timeout 120 python3 -m pytest -q -rxXfs -p no:cacheprovider "tests/$f.py" > "$OUT/$f.log" 2>&1
        echo "$f: rc $?" >> "$OUT/window.txt" ) &
    done
    wait
    unset XLA_PYTHON_CLIENT_PREALLOCATE
    pack window.tgz; cp "$OUT/window.txt" "$DEST/"
    grep -h -E "passed|failed|Max abs|Mismatched" "$OUT"/*.log | head -40
    rm -rf /tmp/mathwork
    part math 170 python3 -m bench.gpu.accelerator --parts math --math_max_new 512 \
      --math_eval_problems 1 --math_workdir /tmp/mathwork --out "$OUT/math"
    cp /tmp/mathwork/run/*.jsonl "$OUT/" 2>/dev/null
    pack window.tgz; cp "$OUT/window.txt" "$DEST/"
    cat "$OUT/window.txt"; cat "$OUT/math/accelerator.md" 2>/dev/null
    ;;
  kernel)
    JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_kv_cache.py \
      -k "pallas or in_place or auto" 2>&1 | tail -25 > "$OUT/tests_kv_cache.txt"
    tail -3 "$OUT/tests_kv_cache.txt"
    timeout 150 python3 -m bench.perf.decode --rows 64 --slots 2048 --prompt 1024 \
      --preset qwen3_0p6b --dtype bfloat16 --json "$OUT/decode_bf16.json" \
      > "$OUT/decode_bf16.md" 2>&1
    tail -12 "$OUT/decode_bf16.md"
    timeout 100 python3 -m bench.perf.decode --rows 64 --slots 2048 --prompt 1024 \
      --preset qwen3_0p6b --dtype bfloat16 --kv_cache_dtype fp8 --impls pallas,paged \
      --json "$OUT/decode_fp8kv.json" > "$OUT/decode_fp8kv.md" 2>&1
    tail -8 "$OUT/decode_fp8kv.md"
    JAX_PLATFORMS=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_native_quant.py 2>&1 \
      | tail -25 > "$OUT/tests_native_quant.txt"
    tail -3 "$OUT/tests_native_quant.txt"
    ;;
  plans)
    timeout 330 python3 -m bench.gpu.paged_kernel --json "$OUT/paged_kernel.json" \
      > "$OUT/paged_kernel.md" 2> "$OUT/paged_kernel.log"
    cat "$OUT/paged_kernel.md"; tail -3 "$OUT/paged_kernel.log"
    ;;
  sampler)
    best=${PLAN:-}
    if [ -z "$best" ]; then
      rm -f "$OUT/paged_kernel.json"
      timeout 100 python3 -m bench.gpu.paged_kernel --ppb 1 --splits 4,8 --warps 4 --stages 2,3 \
        --json "$OUT/paged_kernel.json" > "$OUT/paged_kernel.md" 2> "$OUT/paged_kernel.log"
      cat "$OUT/paged_kernel.md"
      best=$(python3 -c "import json; print(json.load(open('$OUT/paged_kernel.json')).get('best_plan', ''))" 2>/dev/null)
    fi
    [ -z "$best" ] && echo "no plan measured: the sampler runs the default plan"
    echo "plan: ${best:-default}" > "$OUT/plan.txt"
    MIPU_PALLAS_DECODE_PLAN=$best \
    timeout "${SAMPLER_TIMEOUT:-220}" python3 -m bench.gpu.accelerator --parts sampler \
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
    timeout 110 python3 -m bench.probes.native_gap --json "$OUT/native_gap.json" 2>&1 \
      | grep -v Warn > "$OUT/native_gap.txt"
    cat "$OUT/native_gap.txt"
    timeout 210 python3 -m bench.gpu.accelerator --preset qwen3_1p7b --parts sampler \
      --sampler_modes "bf16,fp8 native" --sampler_seqs 16 --sampler_prompt 256 \
      --sampler_new 256 --dump_hlo /tmp/hlo17 --out "$OUT/accelerator_1p7b" \
      > "$OUT/accelerator_1p7b.log" 2>&1
    tail -3 "$OUT/accelerator_1p7b.log"; cat "$OUT/accelerator_1p7b/accelerator.md"
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 80 python3 -m bench.probes.native_gap \
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
    timeout 100 python3 -m bench.probes.native_gap --precisions highest --json "$OUT/native_gap.json" \
      2>&1 | grep -v Warn > "$OUT/native_gap.txt"
    cat "$OUT/native_gap.txt"
    ;;
esac
