# Sourced from the repository root by gpu_setup.sh: the benchmark's cudnn rows on the GPU machine.
# Its torch bundles a cuDNN older than 9.26, so the cudnn method calls the C API of a cuDNN kit
# carried in .cudnn_kit/ (run with carry [".whl", ".cudnn_kit"]; build it here with
# `bash ../shared/tools/cudnn_kit.sh .cudnn_kit`): the kit's tarball is unpacked once per machine
# into $CUDNN_KIT_UNPACK_DIR (94 MB of headers; an unpacked .cudnn_kit/ is used as it is), and
# MONARCH_FFTCONV_CUDNN_KIT names it. One set already is kept.
CUDNN_KIT_UNPACK_DIR=${CUDNN_KIT_UNPACK_DIR:-/tmp/cudnn_kit}
if [ -z "${MONARCH_FFTCONV_CUDNN_KIT:-}" ]; then
  if [ -f .cudnn_kit/lib/libcudnn_ext.so.9 ]; then
    export MONARCH_FFTCONV_CUDNN_KIT=$PWD/.cudnn_kit
  elif [ -f .cudnn_kit/cudnn_kit.tar.xz ]; then
    if [ -f "$CUDNN_KIT_UNPACK_DIR/lib/libcudnn_ext.so.9" ] ||
       { mkdir -p "$CUDNN_KIT_UNPACK_DIR" && tar -xJf .cudnn_kit/cudnn_kit.tar.xz -C "$CUDNN_KIT_UNPACK_DIR"; }; then
      export MONARCH_FFTCONV_CUDNN_KIT=$CUDNN_KIT_UNPACK_DIR
    else
      echo "warning: .cudnn_kit/cudnn_kit.tar.xz did not unpack: no cudnn rows unless the frontend runs"
    fi
  fi
fi
if [ -n "${MONARCH_FFTCONV_CUDNN_KIT:-}" ]; then
  echo "cudnn method: the frontend if it runs, else the C API of the kit in $MONARCH_FFTCONV_CUDNN_KIT"
else
  echo "cudnn method: the frontend if it runs (no .cudnn_kit carried)"
fi
