# Sourced by the GPU scripts (gpu-quant.sh, gpu-moe.sh): `build_peer LOGDIR` builds
# llama.cpp's llama-bench for sm_90a from .gpu/llama.cpp-src.tar.xz into /tmp/llama.cpp
# (about 5 minutes on the GPU machine's 16 cores; a no-op once built), logs in LOGDIR.
L=/tmp/llama.cpp
build_peer() {
  local logs=$1
  [ -x $L/build/bin/llama-bench ] && return 0
  [ -f .gpu/llama.cpp-src.tar.xz ] || { echo "no .gpu/llama.cpp-src.tar.xz"; return 1; }
  tar -xJf .gpu/llama.cpp-src.tar.xz -C /tmp
  (cd $L && cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DCMAKE_BUILD_TYPE=Release >"$logs/llama-cmake.txt" 2>&1 &&
   cmake --build build --target llama-bench -j 12 >"$logs/llama-build.txt" 2>&1) ||
    { echo "llama.cpp build failed"; tail -20 "$logs/llama-build.txt" "$logs/llama-cmake.txt"; return 1; }
}
