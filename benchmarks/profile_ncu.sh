#!/usr/bin/env bash
# Profile one fused-kernel launch with Nsight Compute on the GPU machine.
#
#   PRECISION=bf16 bash benchmarks/profile_ncu.sh        # seed workload 16x256x8192
#   PRECISION=tf32 SHAPE=16x256x4096 bash benchmarks/profile_ncu.sh
#   BACKWARD=1 KERNEL=regex:fftconv_fp32_grad_kernel PRECISION=fp32 bash benchmarks/profile_ncu.sh  # the grad kernel
#     (regex:grad_kernel would match filter_grad_kernel too, and -s 1 -c 1 profiles whichever runs first)
#   SECTIONS="--section SpeedOfLight --section WarpStateStats" ...   # fewer sections: faster
#   IO_DTYPE=bfloat16 ...                                    # u (and dy) in bf16 or fp16: the half-precision I/O instances
# Results in $OUT: prof_<precision>.ncu-rep (open in ncu-ui, or `python benchmarks/ncu_report.py` where
# no ncu is installed: the PC tables from the report alone), details.txt (every section),
# source.csv (per-SASS-line instruction and stall counts, with the CUDA line that made it).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
PRECISION=${PRECISION:-bf16}
SHAPE=${SHAPE:-16x256x8192}
KERNEL=${KERNEL:-regex:monarch_}
# Through the ops, which run the kernel of the precision given (a bf16 call that fills the GPU
# would otherwise take the fp32 kernel: backends.fp32_kernel_is_faster).
export MONARCH_FFTCONV_BACKEND=${MONARCH_FFTCONV_BACKEND:-portable}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)}
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }

cat > /tmp/profile_driver.py <<PY
import torch, monarch_fftconv as mf
B, C, L = (int(x) for x in "$SHAPE".split("x"))
u = torch.randn(B, C, L, device="cuda", dtype=getattr(torch, "${IO_DTYPE:-float32}"))
k = torch.randn(C, L, device="cuda") / L ** 0.5
backward = bool("${BACKWARD:-}")
k.requires_grad_(backward)
u.requires_grad_(backward)
for _ in range(2):
    y = mf.fftconv(u, k, precision="$PRECISION")
    if backward:
        y.backward(torch.randn_like(y))
torch.cuda.synchronize()
print("backend:", mf.explain(u, k, precision="$PRECISION")["backend"])
PY
python3 /tmp/profile_driver.py 2>&1 | tail -2
rep="$OUT/prof_${PRECISION}${IO_DTYPE:+_$IO_DTYPE}"
"$NCU" --clock-control none ${SECTIONS:---set full} --import-source yes -k "$KERNEL" -s 1 -c 1 \
  -f -o "$rep" python3 /tmp/profile_driver.py 2>&1 | tail -5
"$NCU" -i "$rep.ncu-rep" --page details > "$OUT/details.txt" 2>&1
"$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass,cuda > "$OUT/source.csv" 2>&1 ||
  "$NCU" -i "$rep.ncu-rep" --page source --csv > "$OUT/source.csv" 2>&1
head -c 3000 "$OUT/details.txt"
