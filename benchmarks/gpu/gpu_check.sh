#!/usr/bin/env bash
# The checks that need a GPU, in one short run (see README "Measured"). Usage, on a CUDA machine:
#   bash benchmarks/gpu/gpu_check.sh            # from the repository root, torch with CUDA installed
# Prints each section's result; exits non-zero if any check fails. Writes logs to ${OUT:-/tmp}.
set -u -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
pip install -q pytest hypothesis mpmath 2>/dev/null || true
# the C kernel is built by the install (setup.py); CUDA tensors use the pure-torch device path
python setup.py -q build_ext --inplace 2>/dev/null || echo "(C kernel not built: CPU rows use the torch path)"
rc=0
echo "== CUDA tests (kernels on device, no host sync; probe and clocks on CUDA)"
python -m pytest -q -p no:cacheprovider tests/stats/test_cuda.py tests/collect/test_cuda.py tests/probe tests/runlog -k "cuda or CUDA" 2>&1 | tee "$out/gpu_tests.log" | tail -5 || rc=1
echo "== sync-free proofs (dispatch audit on fake CUDA; the real-CUDA ones above run under set_sync_debug_mode('error'))"
python -m pytest -q -p no:cacheprovider tests/stats/test_syncfree.py 2>&1 | tee "$out/syncfree.log" | tail -3 || rc=1
echo "== Kineto join gate (>= 95% of device time joined to ops)"
python benchmarks/gpu/kineto_join_gate.py 2>&1 | tee "$out/kineto_gate.log" | tail -25 || rc=1
echo "== kernel throughput on the GPU (ratios to torch.sum)"
python - <<'PY' 2>&1 | tee "$out/gpu_kernels.log"
import time, torch
from stepscope.stats import reduce_spines, reduce_histograms
for n in (1 << 20, 1 << 24):
    x = torch.randn(n, device="cuda")
    def t(f, k=20):
        f(); torch.cuda.synchronize(); s = time.perf_counter()
        for _ in range(k): f()
        torch.cuda.synchronize(); return (time.perf_counter() - s) / k
    base = t(lambda: x.sum())
    print(f"n={n}: sum {base*1e6:.0f} us, spine {t(lambda: reduce_spines([x]))/base:.1f}x, histogram {t(lambda: reduce_histograms([x]))/base:.1f}x")
    torch.cuda.set_sync_debug_mode("error")  # the timed reductions again, now any sync raises
    reduce_spines([x]); reduce_histograms([x])
    torch.cuda.set_sync_debug_mode("default")
PY
exit $rc
