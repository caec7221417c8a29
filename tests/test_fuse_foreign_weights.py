"""fused_ops.fuse on models whose layers are not plain: quantised weights (a tensor subclass of codes and
scales, as weight-only quantisation libraries make) run their layers' own forwards, and layers that change
their own state when called (a weight repacked on the first eval call, an observer's running statistic)
are left as they were by the probes."""
import copy
import types

import pytest
import torch

import fused_ops

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=101, max_position_embeddings=64)


class Int8Weight(torch.Tensor):
    """Integer codes in [-127, 127] (held in the weight's dtype, as a quantised tensor reports the dtype it
    stands for) and a scale a row: F.linear multiplies by the dequantised weight; any other use sees the
    codes, as a fused op reading the weight directly would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.nn.functional.linear and type(args[1]) is cls:
                x, weight = args[0], args[1]
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                return torch.nn.functional.linear(x, weight.to(x.dtype) * weight.scale.to(x.dtype), bias)
            result = func(*args, **kwargs)
        if func in (torch.Tensor.detach, torch.Tensor.requires_grad_):  # a parameter is made of these
            result = result.as_subclass(cls)
            result.scale = args[0].scale
        return result


def quantised(weight):
    scale = weight.detach().abs().amax(-1, keepdim=True) / 127
    codes = torch.round(weight.detach() / scale).as_subclass(Int8Weight)
    codes.scale = scale
    return torch.nn.Parameter(codes, requires_grad=False)


def llama(device):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(device)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


def loss_and_norm_gradients(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if "norm" in name}


def test_quantised_projections_and_head_run_their_own_forward(device):
    """The head's and the down projections' weights are int8 codes: the fused head + loss and the fused
    down projection would read the codes as values. They run the layers' own products; the norms around
    them are still fused."""
    def quantised_llama():
        model = llama(device)
        model.lm_head.weight = quantised(model.lm_head.weight)
        for layer in model.model.layers:
            layer.mlp.down_proj.weight = quantised(layer.mlp.down_proj.weight)
        return model
    model, fused = quantised_llama(), fused_ops.fuse(quantised_llama())
    assert fused.fused_ops_report.counts()["norm"] == 5
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    want, want_grads = loss_and_norm_gradients(model, ids)
    got, got_grads = loss_and_norm_gradients(fused, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_quantised_norm_weight_is_left_alone():
    """A norm whose weight is a tensor subclass is not fused (the op would take the codes), and the report
    says why."""
    model = llama("cpu")
    norm = model.model.norm
    norm.weight = quantised(norm.weight)
    fused_ops.fuse(model)
    assert type(norm) is transformers.models.llama.modeling_llama.LlamaRMSNorm
    assert model.fused_ops_report.counts()["norm"] == 4
    assert "not a plain tensor" in str(model.fused_ops_report)


class StatefulLinear(torch.nn.Linear):
    """A linear layer that changes its own state when called: its first eval call without gradients repacks
    its weight into new storage for good (bitsandbytes' 4-bit layer does so on the CPU, and no gradient
    flows through it afterwards), and each call records the largest input it has seen in a buffer in
    place (an observer's statistic)."""

    def __init__(self, linear):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device=linear.weight.device)
        self.load_state_dict(linear.state_dict())
        self.weight.packing = types.SimpleNamespace(packed=False)
        self.register_buffer("largest_input", torch.zeros((), device=linear.weight.device))

    def forward(self, x):
        with torch.no_grad():
            self.largest_input.copy_(torch.maximum(self.largest_input, x.abs().amax()))
        if not self.training and not torch.is_grad_enabled() and not self.weight.packing.packed:
            self.weight.data = self.weight.data.clone()
            self.weight.packing.packed = True
        return super().forward(x)


def test_probes_leave_layers_that_change_their_own_state_as_they_were(device):
    """The probes call the model's own modules: what those calls change (a parameter's storage and the
    objects it holds, a buffer's values) is put back, and training afterwards matches the stock model."""
    model = llama(device)
    for layer in model.model.layers:
        layer.self_attn.o_proj = StatefulLinear(layer.self_attn.o_proj)
    stock = copy.deepcopy(model)
    layers = [layer.self_attn.o_proj for layer in model.model.layers]
    pointers = [layer.weight.data_ptr() for layer in layers]
    fused_ops.fuse(model)
    assert model.fused_ops_report.counts()["norm"] == 5
    for layer, pointer in zip(layers, pointers):
        assert layer.weight.data_ptr() == pointer
        assert not layer.weight.packing.packed
        assert layer.largest_input.item() == 0
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    for module in (stock, model):
        module.zero_grad(set_to_none=True)
        module(input_ids=ids, labels=ids).loss.backward()
    for want, got in zip(stock.model.layers, model.model.layers):
        torch.testing.assert_close(got.self_attn.o_proj.weight.grad, want.self_attn.o_proj.weight.grad,
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got.self_attn.o_proj.largest_input, want.self_attn.o_proj.largest_input)


class ShiftedRMSNorm(transformers.models.llama.modeling_llama.LlamaRMSNorm):
    """An RMSNorm that scales and shifts after normalising: not what rms_norm computes."""

    def forward(self, hidden_states):
        return 2 * super().forward(hidden_states) + 0.5


def test_a_forward_set_on_the_instance_is_left_alone_and_proves_nothing_for_its_twins():
    """A wrapper set on a module instance (accelerate's mixed precision sets a prepared model's forward so)
    hides the class a swap changes: that module is left alone with the reason, and its probe, which would
    compare the wrapper with itself, does not stand for the identical modules beside it."""
    model = llama("cpu")
    for layer in model.model.layers:
        for name in ("input_layernorm", "post_attention_layernorm"):
            norm = getattr(layer, name)
            norm.__class__ = ShiftedRMSNorm
    first = model.model.layers[0].input_layernorm
    first.forward = types.MethodType(ShiftedRMSNorm.forward, first)
    model.forward = types.MethodType(type(model).forward, model)
    stock = copy.deepcopy(model)
    fused_ops.fuse(model)
    report = str(model.fused_ops_report)
    assert "its forward is set on the instance" in report
    assert [entry.kind for entry in model.fused_ops_report.entries if not entry.swapped].count("norm") == 4
    assert not any(entry.swapped for entry in model.fused_ops_report.entries if entry.kind == "lm_head_loss")
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    want, want_grads = loss_and_norm_gradients(stock, ids)
    got, got_grads = loss_and_norm_gradients(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("model_type, change", [
    ("llama", "epsilon"), ("qwen3_next", "epsilon"), ("gemma2", "softcap"), ("granite", "logits_scaling"),
    ("granite", "residual_multiplier"), ("llama", "activation"), ("qwen3_moe", "activation")])
def test_constants_changed_after_fuse_are_the_stock_forwards_to_use(model_type, change):
    """fuse() proves a norm with its epsilon, the head with the config's soft cap and logit scale, a layer
    with its residual multiplier and an MLP or experts' gate with its activation module; a value or an
    activation set after fuse() reaches the stock forward, never a fused one that still holds the old one."""
    import hf_families
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    assert fused.fused_ops_report.swapped
    for model in (stock, fused):
        if change == "epsilon":
            for module in model.modules():
                for name in ("variance_epsilon", "eps"):
                    if isinstance(getattr(module, name, None), float):
                        setattr(module, name, 0.5)
        elif change == "softcap":
            model.config.final_logit_softcapping = 2.0
        elif change == "residual_multiplier":
            for layer in model.model.layers:
                layer.residual_multiplier = 0.5
        elif change == "activation":
            for layer in model.model.layers:
                mlp = getattr(layer.mlp, "experts", layer.mlp)
                mlp.act_fn = torch.nn.Tanh()
        else:
            model.config.logits_scaling = 0.25
    ids = hf_families.batch(stock)
    want, want_grads = loss_and_norm_gradients(stock.train(), ids)
    got, got_grads = loss_and_norm_gradients(fused.train(), ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        if grad is not None:
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
