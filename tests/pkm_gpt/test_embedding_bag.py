"""Weighted embedding bag: reference and Triton kernels on the test device (interpreter on CPU) against torch's
embedding_bag on CPU, with dense and row-sparse value gradients."""

import pytest
import torch
import torch.nn.functional as F

from projects.pkm_gpt.ops.embedding_bag import embedding_bag, embedding_bag_reference
from projects.pkm_gpt.ops.embedding_bag.triton import embedding_bag_triton

IMPLEMENTATIONS = {
    "reference": embedding_bag_reference,
    "triton-atomic": lambda v, i, w: embedding_bag_triton(v, i, w, value_grad="atomic"),
    "triton-segment": lambda v, i, w: embedding_bag_triton(v, i, w, value_grad="segment"),
}
SPARSE_IMPLEMENTATIONS = {
    "reference": lambda v, i, w: embedding_bag_reference(v, i, w, sparse_values=True),
    "triton": lambda v, i, w: embedding_bag_triton(v, i, w, sparse_values=True),
}

# (table rows N, bags R, bag size k, v_dim): odd sizes; few rows so indices repeat within and across bags;
# k and v_dim above the kernels' block sizes (32, 128); one row hit by every entry (a long segment).
SHAPES = [pytest.param((11, 37, 7, 19), id="N11-R37-k7-v19"), pytest.param((300, 5, 33, 130), id="N300-R5-k33-v130"),
          pytest.param((1, 3, 40, 5), id="N1-R3-k40-v5"), pytest.param((64, 1, 1, 1), id="N64-R1-k1-v1")]

# (values dtype, weights dtype): fp32; bf16 table with fp32 softmax weights (the PKM case); all bf16.
DTYPES = [pytest.param(torch.float32, torch.float32, id="fp32"),
          pytest.param(torch.bfloat16, torch.float32, id="bf16-values"),
          pytest.param(torch.bfloat16, torch.bfloat16, id="bf16")]


def random_inputs(num_rows, num_bags, bag_size, v_dim, values_dtype, weights_dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(num_rows, v_dim, generator=generator).to(values_dtype)
    indices = torch.randint(0, num_rows, (num_bags, bag_size), generator=generator)
    indices[0, -1] = indices[0, 0]  # a repeat inside one bag, whatever the draw
    weights = torch.randn(num_bags, bag_size, generator=generator).to(weights_dtype)
    # Drawn in the output dtype so that its fp32 upcast for torch's embedding_bag is exact.
    grad_out = torch.randn(num_bags, v_dim, generator=generator).to(torch.promote_types(values_dtype, weights_dtype))
    return values, indices, weights, grad_out


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def output_and_grads(fn, values, indices, weights, grad_out):
    values = values.clone().requires_grad_()
    weights = weights.clone().requires_grad_()
    out = fn(values, indices, weights)
    grad_values, grad_weights = torch.autograd.grad(out, (values, weights), grad_out.to(out.dtype))
    return out, grad_values, grad_weights


def torch_embedding_bag_fp32(values, indices, weights, grad_out):
    """torch's own embedding_bag on the exact fp32 upcast of the inputs: the fp32-accumulated answer."""
    return output_and_grads(
        lambda v, i, w: F.embedding_bag(i, v, mode="sum", per_sample_weights=w),
        values.float(), indices, weights.float(), grad_out)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("values_dtype,weights_dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch_embedding_bag(name, values_dtype, weights_dtype, shape, device):
    values, indices, weights, grad_out = random_inputs(*shape, values_dtype, weights_dtype, seed=sum(shape))
    out, grad_values, grad_weights = output_and_grads(IMPLEMENTATIONS[name],
                                                      *on(device, values, indices, weights, grad_out))
    expected_out, expected_grad_values, expected_grad_weights = torch_embedding_bag_fp32(
        values, indices, weights, grad_out)

    assert out.dtype == torch.promote_types(values_dtype, weights_dtype)
    assert grad_values.dtype == values_dtype and grad_weights.dtype == weights_dtype
    # fp32 accumulation rounded once to the result dtype: within that dtype's default tolerance.
    torch.testing.assert_close(out, expected_out.to(device, out.dtype))
    torch.testing.assert_close(grad_values, expected_grad_values.to(device, values_dtype))
    torch.testing.assert_close(grad_weights, expected_grad_weights.to(device, weights_dtype))


@pytest.mark.parametrize("name", SPARSE_IMPLEMENTATIONS)
@pytest.mark.parametrize("values_dtype,weights_dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_value_gradient_is_the_dense_one_on_the_rows_read(name, values_dtype, weights_dtype, shape, device):
    values, indices, weights, grad_out = random_inputs(*shape, values_dtype, weights_dtype, seed=sum(shape))
    out, grad_values, grad_weights = output_and_grads(SPARSE_IMPLEMENTATIONS[name],
                                                      *on(device, values, indices, weights, grad_out))
    expected_out, expected_grad_values, expected_grad_weights = torch_embedding_bag_fp32(
        values, indices, weights, grad_out)

    assert grad_values.layout == torch.sparse_coo and grad_values.dtype == values_dtype
    # Coalesced, as nn.Embedding(sparse=True) is not: exactly the rows read, each once, rising.
    assert grad_values.is_coalesced()
    assert grad_values.indices()[0].tolist() == sorted(set(indices.flatten().tolist()))
    torch.testing.assert_close(grad_values.to_dense(), expected_grad_values.to(device, values_dtype))
    torch.testing.assert_close(out, expected_out.to(device, out.dtype))
    torch.testing.assert_close(grad_weights, expected_grad_weights.to(device, weights_dtype))


@pytest.mark.parametrize("name", ["triton-atomic", "triton-segment"])
@pytest.mark.parametrize("values_dtype,weights_dtype", DTYPES)
def test_triton_matches_reference(name, values_dtype, weights_dtype, device):
    inputs = on(device, *random_inputs(23, 29, 13, 41, values_dtype, weights_dtype, seed=5))
    actual = output_and_grads(IMPLEMENTATIONS[name], *inputs)
    expected = output_and_grads(embedding_bag_reference, *inputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("value_grad", ["atomic", "segment"])
def test_untouched_rows_get_zero_gradient(value_grad, device):
    values, _, weights, grad_out = random_inputs(50, 9, 5, 17, torch.float32, torch.float32, seed=3)
    indices = torch.randint(10, 20, (9, 5))  # rows outside [10, 20) are never read
    values, indices, weights, grad_out = on(device, values, indices, weights, grad_out)
    _, grad_values, _ = output_and_grads(
        lambda v, i, w: embedding_bag_triton(v, i, w, value_grad=value_grad), values, indices, weights, grad_out)
    untouched = torch.ones(50, dtype=torch.bool, device=device)
    untouched[indices.flatten()] = False
    assert untouched.sum() > 0
    assert torch.all(grad_values[untouched] == 0)
    assert torch.all(grad_values[~untouched].abs().sum(1) > 0)


def test_only_requested_gradients(device):
    values, indices, weights = on(device, *random_inputs(7, 4, 3, 5, torch.float32, torch.float32, seed=1)[:3])
    values.requires_grad_()
    embedding_bag_triton(values, indices, weights).sum().backward()
    assert values.grad is not None and weights.grad is None


@pytest.mark.parametrize("sparse_values", [False, True])
def test_empty_batch(sparse_values, device):
    values = torch.randn(5, 3, device=device, requires_grad=True)
    out = embedding_bag_triton(values, torch.zeros(0, 4, dtype=torch.int64, device=device),
                               torch.zeros(0, 4, device=device), sparse_values=sparse_values)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert values.grad.layout == (torch.sparse_coo if sparse_values else torch.strided)
    assert torch.all(values.grad.to_dense() == 0)


def test_dispatch_uses_reference_on_cpu_by_default():
    values, indices, weights, _ = random_inputs(9, 4, 3, 5, torch.float32, torch.float32, seed=2)
    torch.testing.assert_close(embedding_bag(values, indices, weights),
                               F.embedding_bag(indices, values, mode="sum", per_sample_weights=weights))


@pytest.mark.parametrize("bad", ["int32 indices", "shape mismatch", "1d values", "value_grad"])
def test_bad_input_raises_value_error(bad):
    values, indices, weights = torch.randn(5, 3), torch.zeros(2, 4, dtype=torch.int64), torch.rand(2, 4)
    kwargs = {}
    if bad == "int32 indices":
        indices = indices.int()
    elif bad == "shape mismatch":
        weights = weights[:, :3]
    elif bad == "1d values":
        values = values[0]
    else:
        kwargs["value_grad"] = "scatter"
    with pytest.raises(ValueError):
        embedding_bag_triton(values, indices, weights, **kwargs)


@pytest.mark.parametrize("value_grad", ["atomic", "segment"])
def test_compiles_without_graph_break(value_grad, device):
    values, indices, weights, grad_out = on(device, *random_inputs(13, 6, 5, 7, torch.float32, torch.float32, seed=4))

    def bag_times_two(v, i, w):
        return embedding_bag_triton(v, i, w, value_grad=value_grad) * 2

    torch._dynamo.reset()
    compiled = torch.compile(bag_times_two, backend="aot_eager", fullgraph=True)
    actual = output_and_grads(compiled, values, indices, weights, grad_out)
    expected = output_and_grads(bag_times_two, values, indices, weights, grad_out)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("name", SPARSE_IMPLEMENTATIONS)
def test_sparse_value_gradient_under_torch_compile(name, device):
    # The sparse path is a graph break (its row count depends on the data); the compiled rest still runs.
    values, indices, weights, grad_out = on(device, *random_inputs(13, 6, 5, 7, torch.float32, torch.float32, seed=6))

    def bag_times_two(v, i, w):
        return SPARSE_IMPLEMENTATIONS[name](v, i, w) * 2

    torch._dynamo.reset()
    actual = output_and_grads(torch.compile(bag_times_two, backend="aot_eager"), values, indices, weights, grad_out)
    expected = output_and_grads(bag_times_two, values, indices, weights, grad_out)
    assert actual[1].layout == torch.sparse_coo
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
