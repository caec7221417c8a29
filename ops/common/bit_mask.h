#pragma once
// The bit masks that a forward saves for its backward (relu_add_with_mask): bit e % 8 of byte e / 8
// belongs to element e in C order, so a mask of n elements takes (n + 7) / 8 bytes. One definition
// for the CPU and CUDA kernels, the Meta kernel (SymInt) and the argument checks.
namespace fused_ops {

template <typename Integer>
Integer bit_mask_bytes(const Integer& numel) {
  return (numel + 7) / 8;
}

}  // namespace fused_ops
