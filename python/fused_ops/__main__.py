"""`python -m fused_ops`: what is installed and registered."""
import argparse
import os
import sys

import torch

import fused_ops


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fused_ops", description=__doc__)
    parser.add_argument("--cmake-prefix-path", action="store_true",
                        help="print the prefix to pass to CMake for find_package(FusedOps)")
    args = parser.parse_args()
    if args.cmake_prefix_path:
        print(fused_ops.cmake_prefix_path())
        return
    print(f"fused_ops {fused_ops.__version__}")
    print(f"library: {fused_ops.library_path()}")
    print(f"runner: {fused_ops.runner_path()}")
    print(f"torch: {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"CUDA kernels compiled: {'yes' if fused_ops.cuda_kernels_compiled() else 'no'}")
    if fused_ops.cuda_kernels_compiled():
        print(f"CUDA architectures: {' '.join(fused_ops.cuda_arch_list())}")
    print(f"CUDA device available: {'yes' if torch.cuda.is_available() else 'no'}")
    for index in range(torch.cuda.device_count()):
        why_not = fused_ops.why_cuda_kernels_do_not_run_on(index)
        print(f"GPU {index}: {torch.cuda.get_device_name(index)}: "
              + ("the CUDA kernels run" if why_not is None else why_not))
    print("ops:")
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("fused::"):
            print(f"  {schema}")


if __name__ == "__main__":
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`python -m fused_ops | head`): not an error. Point stdout at
        # devnull so that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
