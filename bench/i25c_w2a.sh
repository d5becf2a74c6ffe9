#!/bin/bash
# i25c W2, call 1 of 2: stash the first piece of nvidia-cutlass-dsl-libs-cu13 and install apache-tvm-ffi and
# cuDNN FE (FlashInfer's dependencies) under /tmp, which stays while the machine is warm. Carry: .carry/cutlass-a, .whl
set -u
mkdir -p /tmp/i25c-dsl && cp .carry/cutlass-a/cu13.part00 /tmp/i25c-dsl/
timeout 20 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/i25c-fisite .whl/apache_tvm_ffi*.whl .whl/nvidia_cudnn_frontend*.whl 2>&1 | tail -2
ls -la /tmp/i25c-dsl; ls /tmp/i25c-fisite | head
