// Loads a scripted model that calls torch.ops.fused.*, runs it on one tensor, prints the result.
#include <torch/script.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fused_example MODEL.pt\n";
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    const at::Tensor x = torch::linspace(-2.0, 2.0, 8).reshape({2, 4});
    const at::Tensor y = torch::ones({4});
    std::cout << model.forward({x, y}).toTensor() << "\n";
  } catch (const std::exception& error) {
    std::cerr << "fused_example: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
