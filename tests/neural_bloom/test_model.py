"""The Neural Bloom Filter's memory against brute force (Algorithm 2 slot by slot), its write order invariance,
sparse addressing, the baselines' states, and that meta-learning (Algorithm 3) learns an easy task."""
import pytest
import torch

from projects.neural_bloom import meta_learning, tasks
from projects.neural_bloom.configs import EncoderConfig, LSTMConfig, MemNetConfig, NBFConfig
from projects.neural_bloom.model import MemoryNetwork, NeuralBloomFilter, SequentialLSTM

BYTES = EncoderConfig(kind="bytes", max_len=7, channels=8, z_dim=16)


def random_strings(*shape, seed=0):
    return torch.randint(1, 256, (*shape, BYTES.max_len), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def nbf(seed=0, **cfg):
    torch.manual_seed(seed)
    return NeuralBloomFilter(NBFConfig(**{"memory_slots": 5, "word_size": 3, "query_dim": 6, "hidden": 16, **cfg}),
                             BYTES).eval()


def test_write_is_order_invariant():
    model = nbf(write_scale=0.1)
    x = random_strings(2, 41)
    permuted = x[:, torch.randperm(41, generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        memory, memory_permuted = model.write(x), model.write(permuted)
    assert memory.shape == (2, 5, 3)
    # float32 sums of 41 terms of order 0.1: a few ulps of the sum
    torch.testing.assert_close(memory_permuted, memory, rtol=1e-5, atol=1e-6)
    # the LSTM baseline is not: it reads the set in order
    torch.manual_seed(0)
    lstm = SequentialLSTM(LSTMConfig(hidden_size=4, query_hidden=8), BYTES).eval()
    with torch.no_grad():
        assert not torch.allclose(lstm.write(x), lstm.write(permuted), atol=1e-4)


@pytest.mark.parametrize("top_k", [0, 2])
def test_read_is_the_per_slot_brute_force(top_k):
    model = nbf(address_top_k=top_k, write_scale=0.5).double()
    x_set, x_query = random_strings(2, 9, seed=2), random_strings(2, 4, seed=3)
    with torch.no_grad():
        logits = model.read(model.write(x_set), x_query)
        a_set, w_set, _ = model.controller(x_set)
        a_q, w_q, z_q = model.controller(x_query)
        expected = torch.empty(2, 4, dtype=torch.float64)
        for b in range(2):
            memory = [sum(a_set[b, i, j] * w_set[b, i] for i in range(9)) for j in range(5)]  # M_j = sum_i a_ij w_i
            for t in range(4):
                r = torch.cat([a_q[b, t, j] * memory[j] for j in range(5)])  # slot j read as a_j M_j
                expected[b, t] = model.f_out(torch.cat([r, w_q[b, t], z_q[b, t]]))
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)
    assert logits.shape == (2, 4)


def test_sparse_address_keeps_the_k_largest_softmax_weights():
    dense, sparse = nbf(seed=4), nbf(seed=4, address_top_k=2)
    x = random_strings(3, 6, seed=5)
    with torch.no_grad():
        a_dense, a_sparse = dense.controller(x)[0], sparse.controller(x)[0]
    torch.testing.assert_close(a_dense.sum(-1), torch.ones(3, 6))
    assert ((a_sparse > 0).sum(-1) == 2).all()
    top = a_dense.topk(2, dim=-1)
    torch.testing.assert_close(a_sparse.gather(-1, top.indices), top.values)


def test_memory_network_reads_the_largest_cosine():
    torch.manual_seed(0)
    model = MemoryNetwork(MemNetConfig(word_size=3), BYTES).eval()
    x_set, x_query = random_strings(1, 6, seed=6), random_strings(1, 3, seed=7)
    with torch.no_grad():
        logits = model.read(model.write(x_set), x_query)
        keys, queries = model.key(model.f_enc(x_set))[0], model.key(model.f_enc(x_query))[0]
        best = [max(float(torch.dot(q, k) / (q.norm() * k.norm())) for k in keys) for q in queries]
    torch.testing.assert_close(logits[0], model.scale * torch.tensor(best) + model.bias, rtol=1e-5, atol=1e-5)


def test_state_sizes():
    assert nbf().state_floats(5000) == 5 * 3
    assert SequentialLSTM(LSTMConfig(hidden_size=7), BYTES).state_floats(5000) == 14  # h and c
    assert MemoryNetwork(MemNetConfig(word_size=2), BYTES).state_floats(5000) == 10_000  # a slot per element


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="address_top_k"):
        NBFConfig(memory_slots=4, address_top_k=5)
    with pytest.raises(ValueError, match="encoder kind"):
        EncoderConfig(kind="image")
    with pytest.raises(ValueError, match="write_scale"):
        NBFConfig(write_scale=0)


def test_meta_learning_learns_class_based_familiarity(single_thread):
    train, held_out = tasks.synthetic_classes(4, 60, 20, dim=8, noise=0.3, seed=0)
    task = tasks.ClassTask(train, held_out, 10)
    torch.manual_seed(0)
    model = NeuralBloomFilter(NBFConfig(memory_slots=2, word_size=2, query_dim=8, hidden=64, write_scale=0.1),
                              EncoderConfig(kind="vector", input_dim=8, z_dim=64))
    first = meta_learning.train(model, task, seconds=60, lr=3e-3, batch_sets=4, queries=32, max_steps=1)["loss"]
    stats = meta_learning.train(model, task, seconds=60, lr=3e-3, batch_sets=4, queries=32, max_steps=300)
    assert stats["steps"] == 300
    assert first > 0.5 and stats["loss"] < 0.01  # the set's class is one of four, visible in the vectors
