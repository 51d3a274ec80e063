"""A converted layer rounds its inputs, outputs and buffers inside its own forward
(`anynum.nn.hooks`): no torch module hooks, the class made for it undone by `restore`, copies and
pickles that keep rounding, and other people's hooks and parametrizations left working.

Oracle: torch's own round-to-nearest-even conversion to bfloat16 (``t.bfloat16().float()``)
applied by hand around the unconverted layer.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import anynum as an
from anynum.nn.hooks import layer_state

pytestmark = pytest.mark.usefixtures("eager_only")


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().bfloat16().float()


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def by_hand(plain: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The layers' inputs and outputs rounded to bfloat16 around the plain layers (no weights)."""
    for layer in plain:
        x = bf16(layer(bf16(x))) if isinstance(layer, (nn.Linear, nn.BatchNorm1d)) else layer(x)
    return x


def test_inputs_outputs_and_buffers_are_rounded_without_torch_hooks():
    policy = an.nn.Policy(activation="bf16", activation_at="both", buffer="bf16")
    plain, model = net(), an.nn.convert(net(), policy)
    x = torch.randn(8, 6) * 3
    assert torch.equal(model(x), by_hand(plain, x))
    for layer, original in zip(model, plain, strict=True):
        assert not (layer._forward_pre_hooks or layer._forward_hooks)  # torch's fast module call
        converted = not isinstance(original, nn.ReLU)
        assert (type(layer) is not type(original)) == converted  # a class made for the layer
        assert isinstance(layer, type(original))
    stats = model[1].running_mean
    assert torch.equal(stats, bf16(stats)) and not torch.equal(stats, torch.zeros(5))  # re-rounded
    assert repr(model).replace("Parametrized", "") == repr(plain)


def test_restore_gives_back_the_classes_and_the_plain_forward():
    plain, model = net(), an.nn.convert(net(), an.nn.Policy(weight="bf16", activation="bf16"))
    model = an.nn.restore(model)
    assert [type(m) for m in model] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    x = torch.randn(8, 6)
    assert torch.equal(model(x), plain(x))


def test_a_pickled_model_keeps_rounding_and_restores():
    """Layers without quantized weights pickle (torch refuses parametrized ones, as before)."""
    plain, model = net(), an.nn.convert(net(), an.nn.Policy(activation="bf16", activation_at="output"))
    x = torch.randn(8, 6) * 3
    loaded = pickle.loads(pickle.dumps(model))
    assert type(loaded[0]) is not nn.Linear and isinstance(loaded[0], nn.Linear)
    assert torch.equal(loaded(x), model(x))
    assert not torch.equal(loaded(x), plain(x))
    loaded = an.nn.restore(loaded)
    assert type(loaded[0]) is nn.Linear and torch.equal(loaded(x), plain(x))


def test_restoring_a_deep_copy_leaves_the_original_rounding():
    """A parametrized layer's class is shared with its deep copies, and holds the rounding forward."""
    plain, model = net(), an.nn.convert(net(), an.nn.Policy(weight="bf16", activation="bf16"))
    x = torch.randn(8, 6) * 3
    before = model(x)
    twin = an.nn.restore(copy.deepcopy(model))
    assert torch.equal(twin(x), plain(x))
    assert torch.equal(model(x), before) and not torch.equal(before, plain(x))


def test_other_hooks_see_the_layer_from_outside():
    """Pre-hooks see the arguments before rounding (and what they return is rounded); forward
    hooks see the rounded output."""
    policy = an.nn.Policy(activation="bf16", include=(nn.Identity,))
    model = an.nn.convert(nn.Sequential(nn.Identity()), policy)
    x = torch.tensor([1 + 2**-12, 3.0])
    seen: dict[str, torch.Tensor] = {}
    model[0].register_forward_pre_hook(lambda m, args: seen.setdefault("pre", args[0]))
    model[0].register_forward_hook(lambda m, args, out: seen.setdefault("post", out))
    y = model(x)
    assert torch.equal(seen["pre"], x) and torch.equal(seen["post"], bf16(x)) and torch.equal(y, bf16(x))
    model[0].register_forward_pre_hook(lambda m, args: (args[0] + 2**-9,))
    assert torch.equal(model(x), bf16(x + 2**-9))


def test_keyword_arguments_pass_unrounded():
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return x * scale

    model = an.nn.convert(nn.Sequential(Scaled()), an.nn.Policy(activation="bf16", include=(Scaled,)))
    x, scale = torch.tensor([1 + 2**-12]), torch.tensor([1 + 2**-11])
    assert torch.equal(model[0](x, scale=scale), bf16(x) * scale)


def test_someone_elses_parametrization_stays_through_convert_and_restore():
    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    parametrize.register_parametrization(layer, "bias", Doubled())
    plain_out = layer(torch.ones(2, 4))
    model = an.nn.convert(nn.Sequential(layer), an.nn.Policy(weight="bf16", activation="bf16"))
    x = torch.randn(2, 4) * 3
    expected = nn.functional.linear(bf16(x), bf16(layer.parametrizations.weight.original), layer.bias)
    assert torch.equal(model(x), expected)
    model = an.nn.restore(model)
    assert parametrize.is_parametrized(model[0], "bias")
    assert not parametrize.is_parametrized(model[0], "weight")
    assert torch.equal(model(torch.ones(2, 4)), plain_out)  # the forward left on torch's class passes through
    assert layer_state(model[0]) is None


def test_convert_restore_convert_rounds_once():
    model = net()
    for _ in range(2):
        model = an.nn.convert(model, an.nn.Policy(activation="bf16"))
        model = an.nn.restore(model)
    model = an.nn.convert(model, an.nn.Policy(activation="bf16", activation_at="both"))
    x = torch.randn(8, 6) * 3
    assert torch.equal(model(x), by_hand(net(), x))


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_real_architectures_convert_copy_and_restore(arch: str) -> None:
    """GPT-2 and BERT built from small configs (random weights, nothing downloaded): no torch
    hooks after convert, a deep copy restores to the original model bit for bit, and the
    converted original keeps computing what it computed before the copy was restored."""
    import transformers

    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=60, n_positions=16)
        plain: nn.Module = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=60
        )
        plain = transformers.BertModel(config)
    plain.eval()
    ids = torch.randint(0, 60, (2, 12))
    with torch.no_grad():
        want = plain(input_ids=ids)[0]
    policy = an.nn.Policy(weight="bf16", activation="bf16", activation_at="both")
    model = an.nn.convert(copy.deepcopy(plain), policy)
    assert an.nn.converted_layers(model)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    model(input_ids=ids)[0].float().square().mean().backward()  # a training-mode step runs
    model.eval()
    with torch.no_grad():
        rounded = model(input_ids=ids)[0]
        restored = an.nn.restore(copy.deepcopy(model))
        assert torch.equal(restored(input_ids=ids)[0], want)
        assert torch.equal(model(input_ids=ids)[0], rounded) and not torch.equal(rounded, want)
