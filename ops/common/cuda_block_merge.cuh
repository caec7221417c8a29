#pragma once
// One value merged across a thread block, for states that merge associatively (a running softmax's
// maximum and sums): across each warp by shuffles, then across the warps through shared memory.
// State has merge(const State&) and shuffled(offset) (the state of the lane `offset` apart, XOR).
namespace fused_ops {
namespace cuda {

// The whole block's state, in every thread. Called once per kernel (its shared slots are reused).
template <int kThreads, typename State>
__device__ State block_merged(State state) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  __shared__ State warps[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) state.merge(state.shuffled(offset));
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = state;
  __syncthreads();
  state = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : State{};
  if (threadIdx.x < 32) {
    for (int offset = 16; offset > 0; offset /= 2) state.merge(state.shuffled(offset));
    if (threadIdx.x == 0) warps[0] = state;
  }
  __syncthreads();
  return warps[0];
}

}  // namespace cuda
}  // namespace fused_ops
