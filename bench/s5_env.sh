# Sourced (not run) from the device checkout's root: `source bench/s5_env.sh`. Session 5's H200 environments.
# The offline H200 takes at most 64 MiB per call, so the packages arrive over several back-to-back calls, each
# carrying some of these git-ignored folders; /tmp survives while the machine stays warm (about 30 s between calls).
# Sourcing installs whatever is carried and not installed yet (idempotent), into /tmp/s5:
#   .cutile  tileiras + ptxas + libnvvm 13.4.92 -> tc/, cuda-tile 1.7.0 -> tsite/  (../shared/gpu/cutile-toolchain.sh)
#   .whl     cuDNN FE 1.32.0 + apache-tvm-ffi 0.1.15 -> cudnn/; fla-core + flash-linear-attention 0.6.0 -> fla/
#   .dsl/a   nvidia-cutlass-dsl 4.8.1's meta, libs-base, libs-core wheels and the first 40 MB of libs-cu13
#   .dsl/b   the rest of libs-cu13 (cu13.part01, cu13.part02, cu13.sha256): joined, checked, all installed -> dsl/
#   .fi      flashinfer-python 0.7.2.post1 without its flashinfer/data (CUDA sources for JIT; the SM90 GDN kernels
#            are CuTe DSL) -> fi/
#   .qla     one tarball of flash-qla 0.1.3, tilelang 0.1.15, apache-tvm-ffi 0.1.12, z3-solver 4.15.4 (its .data
#            left out), torch-c-dlpack-ext 0.1.5, FLA 0.6.0 -> qla/
# Then it defines, for each environment, a PYTHONPATH whose last entry holds `deltacheck` -> $S5_CODE (default:
# the checkout root; a helper's synced copy with S5_CODE=.carry/NAME):
#   S5_PP_CUDNN  cuDNN FE + tvm-ffi 0.1.15 + cuda.tile          S5_PP_KDAH  that + the CuTe DSL
#   S5_PP_FI     FlashInfer + CuTe DSL + FE/tvm-ffi 0.1.15      S5_PP_QLA   the qla tarball (FLA inside)
#   S5_PP_FLA    FLA 0.6 alone
# s5_cutile_env: the cuTile toolchain for cuDNN processes (call it in their subshell only: it unsets CUDA_HOME,
# which TileLang's nvcc lookup would miss). s5_have NAME (cutile cudnn fla dsl fi qla): installed or not.
S5=${S5_ROOT:-/tmp/s5}
mkdir -p "$S5"
_s5_log() { echo "s5_env: $*" | tee -a "$S5/setup.log"; }
_s5_pip() { local dest=$1; shift; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dest" "$@" 2>&1 | grep -v "^WARNING" | tail -3; }

s5_cutile_env() {
  unset CUDA_HOME CUDA_PATH  # tileiras would take $CUDA_HOME's 13.0 ptxas and libnvvm over its own 13.4
  export PATH=$S5/tc/nvidia/cu13/bin:$PATH CUDAToolkit_ROOT=/usr/local/cuda
}
s5_have() {
  case $1 in
    cutile) [ -x "$S5/tc/nvidia/cu13/bin/tileiras" ] && [ -d "$S5/tsite/cuda" ] ;;
    cudnn) [ -d "$S5/cudnn/cudnn" ] ;;
    fla) [ -d "$S5/fla/fla" ] ;;
    dsl) [ -d "$S5/dsl/nvidia_cutlass_dsl" ] ;;
    fi) [ -d "$S5/fi/flashinfer" ] && [ -d "$S5/dsl/nvidia_cutlass_dsl" ] && [ -d "$S5/cudnn/tvm_ffi" ] ;;
    qla) [ -d "$S5/qla/flash_qla" ] ;;
    *) return 2 ;;
  esac
}
if [ -f .cutile/tc-13.4.92.tar.xz ] && [ ! -x "$S5/tc/nvidia/cu13/bin/tileiras" ]; then
  mkdir -p "$S5/tc" && tar -xJf .cutile/tc-13.4.92.tar.xz -C "$S5/tc" && _s5_pip "$S5/tsite" .cutile/cuda_tile-*.whl
  _s5_log "cuTile toolchain: $(s5_have cutile && echo installed || echo FAILED)"
fi
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1 && [ ! -d "$S5/cudnn/cudnn" ]; then
  _s5_pip "$S5/cudnn" .whl/nvidia_cudnn_frontend-*.whl .whl/apache_tvm_ffi-*.whl
  _s5_pip "$S5/fla" .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl
  _s5_log "cuDNN FE + tvm-ffi -> cudnn/: $(s5_have cudnn && echo ok || echo FAILED); FLA -> fla/: $(s5_have fla && echo ok || echo FAILED)"
fi
if [ -f .dsl/a/cu13.part00 ] && [ ! -f "$S5/dslparts/cu13.part00" ]; then
  mkdir -p "$S5/dslparts" && cp .dsl/a/* "$S5/dslparts/" && _s5_log "CuTe DSL piece a stashed"
fi
if [ -f .dsl/b/cu13.part01 ] && [ -f "$S5/dslparts/cu13.part00" ] && [ ! -d "$S5/dsl/nvidia_cutlass_dsl" ]; then
  _S5_DSL_WHL=$S5/dslparts/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  cat "$S5/dslparts/cu13.part00" .dsl/b/cu13.part01 .dsl/b/cu13.part02 > "$_S5_DSL_WHL"
  if [ "$(sha256sum "$_S5_DSL_WHL" | cut -c1-64)" = "$(cat .dsl/b/cu13.sha256)" ]; then
    _s5_pip "$S5/dsl" "$S5"/dslparts/*.whl; _s5_log "CuTe DSL 4.8.1 -> dsl/: $(s5_have dsl && echo ok || echo FAILED)"
  else _s5_log "CuTe DSL libs-cu13: sha256 mismatch after joining the pieces, not installed"; fi
fi
if [ -f .fi/fi-nodata.tar.xz ] && [ ! -d "$S5/fi/flashinfer" ]; then
  mkdir -p "$S5/fi" && tar -xJf .fi/fi-nodata.tar.xz -C "$S5/fi" ; _s5_log "FlashInfer -> fi/: $([ -d "$S5/fi/flashinfer" ] && echo ok || echo FAILED)"
fi
if [ -f .qla/qla.tar.xz ] && [ ! -d "$S5/qla/flash_qla" ]; then
  mkdir -p "$S5/qla" && xz -T4 -dc .qla/qla.tar.xz | tar -xf - -C "$S5/qla" ; _s5_log "qla tarball -> qla/: $(s5_have qla && echo ok || echo FAILED)"
fi

S5_CODE=$(cd "${S5_CODE:-.}" && pwd)
_s5_dc=$S5/dc-$(basename "$S5_CODE")
mkdir -p "$_s5_dc" && ln -sfn "$S5_CODE" "$_s5_dc/deltacheck"
_s5_dslp=$S5/dsl:$S5/dsl/nvidia_cutlass_dsl/dsl_packages  # a --target install skips the DSL's .pth
S5_PP_CUDNN=$S5/cudnn:$S5/tsite:$_s5_dc
S5_PP_KDAH=$S5/cudnn:$S5/tsite:$_s5_dslp:$_s5_dc
S5_PP_FI=$S5/fi:$S5/cudnn:$_s5_dslp:$_s5_dc
S5_PP_QLA=$S5/qla:$_s5_dc
S5_PP_FLA=$S5/fla:$_s5_dc
export S5 S5_CODE S5_PP_CUDNN S5_PP_KDAH S5_PP_FI S5_PP_QLA S5_PP_FLA

_s5_log "have:$(for n in cutile cudnn fla dsl fi qla; do s5_have $n && printf ' %s' $n; done) code=$S5_CODE"
