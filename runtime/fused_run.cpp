// fused_run MODEL INPUTS OUTPUTS [--device cpu|cuda] [--grad]
//
// Runs a TorchScript model (.pt) or an AOTInductor package (.pt2) that calls torch.ops.fused.*
// in a C++ process with no Python. INPUTS is a file from `torch.save([t0, t1, ...])`; OUTPUTS
// is written so that `torch.load` returns a list: the forward outputs (tuples and lists
// flattened in order), then with --grad the gradient of the sum of all outputs with respect to
// each input, in input order. Errors: one line on stderr, exit code 1; bad usage: exit code 2.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: fused_run MODEL INPUTS OUTPUTS [--device cpu|cuda] [--grad]\n"
    "  MODEL    TorchScript file (.pt) or AOTInductor package (.pt2)\n"
    "  INPUTS   file written by torch.save([t0, t1, ...])\n"
    "  OUTPUTS  file to write; torch.load gives [outputs..., gradients...]\n"
    "  --device cpu|cuda  device to run on (default cpu)\n"
    "  --grad   also write d(sum of outputs)/d(input) for each input (TorchScript only)\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string model, inputs, outputs;
  std::string device = "cpu";
  bool grad = false;
};

Options parse_arguments(int argc, char** argv) {
  Options options;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--help" || argument == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (argument == "--grad") {
      options.grad = true;
    } else if (argument == "--device") {
      if (i + 1 >= argc) throw UsageError("--device needs a value: cpu or cuda");
      options.device = argv[++i];
      if (options.device != "cpu" && options.device != "cuda") {
        throw UsageError("--device must be cpu or cuda, not '" + options.device + "'");
      }
    } else if (argument.rfind("--", 0) == 0) {
      throw UsageError("unknown option " + argument);
    } else {
      positional.push_back(argument);
    }
  }
  if (positional.size() != 3) throw UsageError("expected MODEL INPUTS OUTPUTS");
  options.model = positional[0];
  options.inputs = positional[1];
  options.outputs = positional[2];
  return options;
}

std::vector<char> read_file(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error(std::string("cannot read ") + what + " file '" + path + "'");
  return std::vector<char>(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

bool contains(const std::vector<char>& data, const std::string& needle) {
  return std::search(data.begin(), data.end(), needle.begin(), needle.end()) != data.end();
}

enum class ModelKind { TorchScript, AOTInductorPackage };

// Both formats are zip archives; their entry names (stored uncompressed) tell them apart.
ModelKind model_kind(const std::string& path) {
  const std::vector<char> data = read_file(path, "MODEL");
  const bool zip = data.size() >= 4 && data[0] == 'P' && data[1] == 'K';
  if (zip && contains(data, "aotinductor/")) return ModelKind::AOTInductorPackage;
  if (zip && contains(data, "constants.pkl") && contains(data, "code/")) return ModelKind::TorchScript;
  throw std::runtime_error("MODEL '" + path +
                           "' is neither a TorchScript file nor an AOTInductor package");
}

std::vector<at::Tensor> load_inputs(const std::string& path) {
  const c10::IValue loaded = torch::pickle_load(read_file(path, "INPUTS"));
  if (!loaded.isList() && !loaded.isTuple()) {
    throw std::runtime_error("INPUTS '" + path + "' must hold a list of tensors");
  }
  std::vector<at::Tensor> inputs;
  const auto elements = loaded.isList() ? loaded.toListRef().vec() : loaded.toTupleRef().elements().vec();
  for (const c10::IValue& element : elements) {
    if (!element.isTensor()) {
      throw std::runtime_error("INPUTS '" + path + "' must hold only tensors, found " +
                               element.tagKind());
    }
    inputs.push_back(element.toTensor());
  }
  return inputs;
}

void flatten_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) flatten_tensors(element, out);
  } else if (value.isList()) {
    for (const auto& element : value.toListRef()) flatten_tensors(element, out);
  } else {
    throw std::runtime_error("model output holds a " + value.tagKind() + ", expected tensors");
  }
}

std::vector<at::Tensor> run_torchscript(const Options& options, std::vector<at::Tensor>& inputs) {
  torch::jit::Module module = torch::jit::load(options.model, c10::Device(options.device));
  module.eval();
  const auto& schema = module.get_method("forward").function().getSchema();
  const size_t expected = schema.arguments().size() - 1;  // minus self
  if (inputs.size() != expected) {
    throw std::runtime_error("model forward takes " + std::to_string(expected) +
                             " inputs, INPUTS holds " + std::to_string(inputs.size()));
  }
  if (options.grad) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].is_floating_point() || inputs[i].is_complex()) {
        inputs[i].requires_grad_(true);
      } else {
        std::cerr << "fused_run: note: input " << i << " is " << inputs[i].scalar_type()
                  << ", not floating point: it gets no gradient (None in OUTPUTS)\n";
      }
    }
  }
  std::vector<c10::IValue> arguments(inputs.begin(), inputs.end());
  std::vector<at::Tensor> outputs;
  flatten_tensors(module.forward(arguments), outputs);
  if (!options.grad) return outputs;

  at::Tensor total;
  for (const auto& output : outputs) {
    const at::Tensor sum = output.sum();
    total = total.defined() ? total + sum : sum;
  }
  std::vector<at::Tensor> differentiable;
  for (const auto& input : inputs) {
    if (input.requires_grad()) differentiable.push_back(input);
  }
  std::vector<at::Tensor> gradients;
  if (total.defined() && total.requires_grad() && !differentiable.empty()) {
    gradients = torch::autograd::grad({total}, differentiable, {}, false, false, /*allow_unused=*/true);
  }
  std::vector<at::Tensor> result;
  for (const auto& output : outputs) result.push_back(output.detach());
  size_t next = 0;
  for (const auto& input : inputs) {
    if (!input.requires_grad()) {  // an integer or bool input: no gradient, written as None
      result.emplace_back();
      continue;
    }
    const at::Tensor gradient = next < gradients.size() ? gradients[next++] : at::Tensor();
    result.push_back(gradient.defined() ? gradient : at::zeros_like(input));
  }
  return result;
}

std::vector<at::Tensor> run_package(const Options& options, const std::vector<at::Tensor>& inputs) {
  if (options.grad) throw std::runtime_error("--grad needs a TorchScript model; AOTInductor packages run inference only");
  torch::inductor::AOTIModelPackageLoader loader(options.model);
  return loader.run(inputs);
}

// torch::pickle_save with untagged aggregates: a list is written as a plain Python list, which
// torch.load reads with its default weights_only=True (a type-tagged list needs a jit global). An
// undefined tensor is written as None.
std::vector<char> save_tensor_list(const std::vector<at::Tensor>& tensors) {
  c10::impl::GenericList list(c10::AnyType::get());  // Tensor-typed lists pickle as a jit global
  for (const auto& tensor : tensors) {
    list.push_back(tensor.defined() ? c10::IValue(tensor.detach().cpu()) : c10::IValue());
  }
  std::vector<char> pickle_bytes;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { pickle_bytes.insert(pickle_bytes.end(), bytes, bytes + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(list));
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

int run(const Options& options) {
  if (options.device == "cuda" && !torch::cuda::is_available()) {
    throw std::runtime_error("--device cuda asked, but no CUDA GPU is available");
  }
  const ModelKind kind = model_kind(options.model);
  std::vector<at::Tensor> inputs = load_inputs(options.inputs);
  for (auto& input : inputs) input = input.to(c10::Device(options.device));
  const std::vector<at::Tensor> outputs = kind == ModelKind::TorchScript
                                              ? run_torchscript(options, inputs)
                                              : run_package(options, inputs);
  const std::vector<char> bytes = save_tensor_list(outputs);
  std::ofstream file(options.outputs, std::ios::binary);
  if (!file || !file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    throw std::runtime_error("cannot write OUTPUTS file '" + options.outputs + "'");
  }
  return 0;
}

// The line of an error worth printing, made printable (messages can quote bytes of a corrupt file):
// its first non-empty line, or, for an error raised inside the TorchScript interpreter (whose first
// line only says so, then a traceback follows), the reason at the end: the last line that starts
// with an exception's name ("RuntimeError: fused::relu_add: expected ...").
std::string error_line(const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  static constexpr char kNameCharacters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_.";
  size_t start = std::min(text.size(), text.find_first_not_of(" \n"));
  static const std::string kInterpreterError = "The following operation failed in the TorchScript interpreter";
  if (text.compare(start, kInterpreterError.size(), kInterpreterError) == 0) {
    for (size_t line_start = start; line_start < text.size();) {
      const size_t name_end = text.find_first_not_of(kNameCharacters, line_start);
      const std::string name = text.substr(line_start, std::min(name_end, text.size()) - line_start);
      const bool exception = name.find("Error") != std::string::npos || name.find("Exception") != std::string::npos;
      if (exception && name_end != std::string::npos && text.compare(name_end, 2, ": ") == 0) {
        start = name_end + 2;  // the reason, without the exception's name
      }
      const size_t next = text.find('\n', line_start);
      if (next == std::string::npos) break;
      line_start = next + 1;
    }
  }
  std::string line;
  for (const char c : text.substr(start, text.find('\n', start) - start)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      line += c;
    } else {
      line += "\\x";
      line += kHex[byte >> 4];
      line += kHex[byte & 15];
    }
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_arguments(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "fused_run: " << error.what() << "\n" << kUsage;
    return 2;
  }
  try {
    return run(options);
  } catch (const c10::Error& error) {
    std::cerr << "fused_run: error: " << error_line(error.what_without_backtrace()) << "\n";
  } catch (const std::exception& error) {
    std::cerr << "fused_run: error: " << error_line(error.what()) << "\n";
  } catch (...) {
    std::cerr << "fused_run: error: unknown exception\n";
  }
  return 1;
}
