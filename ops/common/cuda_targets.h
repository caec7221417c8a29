#pragma once
// Whether this build has code the GPU in use runs: a build for other GPUs fails every launch with CUDA's
// bare "no kernel image is available"; this check says which GPU, which targets and how to rebuild.
namespace fused_ops {
namespace cuda {

// Raises where the library's kernels have no code that GPU `device` runs; cached once it runs.
void check_kernels_run_on(int device);

}  // namespace cuda
}  // namespace fused_ops
