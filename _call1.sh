export OUT0=$OUT OUT=/tmp/o; mkdir -p /tmp/o; trap 'cp /tmp/o/profiles.tgz $OUT0/ 2>/dev/null; tar czf $OUT0/all.tgz -C /tmp/o --exclude profiles.tgz .' EXIT
source benchmarks/gpu_setup.sh >/tmp/o/setup.log 2>&1
tail -3 /tmp/o/setup.log
BUDGET=330 bash benchmarks/profile_set.sh \
  "grad BACKWARD=1 KERNEL=regex:fftconv_fp32_grad PRECISION=fp32" \
  "tc1 MONARCH_FFTCONV_TC_KERNEL=sm90 KERNEL=regex:monarch_sm90 PRECISION=bf16" \
  "fwd32 KERNEL=regex:fftconv_fp32 PRECISION=fp32"
