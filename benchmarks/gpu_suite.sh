#!/usr/bin/env bash
# The GPU suite, in one call, for the day a GPU is lent (see benchmarks/RESULTS.md):
#   bash benchmarks/gpu_suite.sh OUTDIR --data-dir DIR [--smoke]
# 1. the tests that need CUDA (pytest -m cuda; stopped after 180 s, so a hang cannot eat the
# lease), 2. benchmarks/gpu_bench.py: dptrain against plain PyTorch loops on one GPU, into
# OUTDIR/gpu.json and OUTDIR/gpu.md (rewritten after every variant; variants not started
# within 360 s are skipped), 3. benchmarks/host_profile.py: where a step's host time goes on
# the GPU (ATen operations, syncs and Python calls a step, the plain loop against dptrain) for
# the small programs, into OUTDIR/host.json and OUTDIR/host.md, 4. benchmarks/bench_fp16.py:
# amp fp16 against the plain loop with a GradScaler, into OUTDIR/fp16.json (at most 120 s).
# Under 10 minutes on one H100.
# --smoke runs it all on the CPU for a few batches (CI does, so it cannot rot).
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_suite.sh OUTDIR --data-dir DIR [--smoke]}
shift
cd "$(dirname "$0")/.."
py=${PYTHON:-python}       # the interpreter with torch (PYTHON=... to choose another)
mkdir -p "$out"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())" | tee "$out/env.txt"
nvidia-smi >> "$out/env.txt" 2>&1 || true
cuda_tests=(tests)
case " $* " in *" --smoke "*) cuda_tests=(tests/test_cuda.py) ;; esac     # (the whole tree collects in 15 s)
timeout 180 "$py" -m pytest -q -m cuda "${cuda_tests[@]}" 2>&1 | tee "$out/tests.txt"
tests=${PIPESTATUS[0]}        # 124: stopped after 180 s
if [ "$tests" -ne 0 ] && [ "$tests" -ne 5 ]; then     # 5: no test ran (no GPU here)
    echo "gpu_suite: the CUDA tests failed (see $out/tests.txt); measuring all the same" >&2
fi
"$py" benchmarks/gpu_bench.py --out "$out/gpu.json" --md "$out/gpu.md" "$@" 2>&1 | tee "$out/bench.txt"
bench=${PIPESTATUS[0]}
host_args=(--device cuda:0 --programs tiny-mlp,text,hf-style)
case " $* " in *" --smoke "*) host_args=(--device cpu:0 --programs tiny-mlp,text --smoke) ;; esac
timeout 300 "$py" benchmarks/host_profile.py "${host_args[@]}" --out "$out/host.json" --md "$out/host.md" 2>&1 \
    | tee "$out/host.txt"
host=${PIPESTATUS[0]}
fp16_args=(--device cuda:0 --models mlp,cnn --rounds 3)
case " $* " in *" --smoke "*) fp16_args=(--smoke) ;; esac
timeout 120 "$py" benchmarks/bench_fp16.py "${fp16_args[@]}" --out "$out/fp16.json" 2>&1 | tee "$out/fp16.txt" \
    || echo "gpu_suite: bench_fp16 failed (see $out/fp16.txt)" >&2
if [ "$bench" -ne 0 ]; then exit "$bench"; fi
if [ "$host" -ne 0 ]; then exit "$host"; fi
if [ "$tests" -ne 0 ] && [ "$tests" -ne 5 ]; then exit "$tests"; fi
