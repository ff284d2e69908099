import pytest
import torch

from projects.qlstm.cell import FORGET_GATE_OFFSET, MultiHeadLSTM, QuasiLSTM

IMPLS = ["loop", "block", "triton"]
TORCH_GATE_ORDER = [1, 0, 2, 3]  # torch.nn.LSTMCell stacks (i, f, g, o); the cells lay out (f, i, z, o)


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def reference_forward(cell, x, c0, h0):
    """The cell rebuilt from one torch.nn.LSTMCell per head in float64; qLSTM heads get zero recurrent weights
    and the forget-gate offset of the reference code's quasi cell (its classic LSTM, eq. 11, has none)."""
    n_heads, d_head = cell.n_heads, cell.d_head
    weight = cell.gates.weight.detach().double().view(n_heads, 4, d_head, -1)
    bias = cell.gates.bias.detach().double().view(n_heads, 4, d_head).clone()
    if isinstance(cell, QuasiLSTM):
        bias[:, 0] += FORGET_GATE_OFFSET
    heads = []
    for h in range(n_heads):
        lstm = torch.nn.LSTMCell(cell.d_model, d_head, dtype=torch.float64)
        with torch.no_grad():
            lstm.weight_ih.copy_(weight[h, TORCH_GATE_ORDER].reshape(4 * d_head, -1))
            lstm.bias_ih.copy_(bias[h, TORCH_GATE_ORDER].reshape(-1))
            lstm.bias_hh.zero_()
            if isinstance(cell, MultiHeadLSTM):
                recurrent = cell.recurrent.detach().double()[h].T.reshape(4, d_head, d_head)
                lstm.weight_hh.copy_(recurrent[TORCH_GATE_ORDER].reshape(4 * d_head, d_head))
            else:
                lstm.weight_hh.zero_()
        heads.append(lstm)
    c = [c0[:, h].double() for h in range(n_heads)]
    hid = [h0[:, h].double() for h in range(n_heads)]
    outputs = []
    for t in range(x.shape[1]):
        for h in range(n_heads):
            hid[h], c[h] = heads[h](x[:, t].double(), (hid[h], c[h]))
        outputs.append(torch.cat(hid, dim=-1))
    y = torch.nn.functional.linear(torch.stack(outputs, dim=1), cell.out.weight.double(), cell.out.bias.double())
    return y, torch.stack(c, dim=1), torch.stack(hid, dim=1)


def randomise(cell, seed):
    # larger than the init so that the gates are far from 0.5 and a wrong wiring shows
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in cell.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return cell


def test_quasi_lstm_parameter_count_by_hand():
    # gates 20 -> 4*3*5 with bias, output 15 -> 20 with bias
    assert n_params(QuasiLSTM(20, 3, 5)) == 20 * 60 + 60 + 15 * 20 + 20


def test_multi_head_lstm_parameter_count_by_hand():
    # as the qLSTM plus U in R^{d_head x d_head} for each of 4 gates and 3 heads, no extra bias
    assert n_params(MultiHeadLSTM(20, 3, 5)) == 20 * 60 + 60 + 15 * 20 + 20 + 3 * 4 * 5 * 5


@pytest.mark.parametrize("impl", IMPLS)
def test_quasi_lstm_matches_lstm_cell_reference_without_recurrent_weights(impl, device):
    torch.manual_seed(0)
    cell = randomise(QuasiLSTM(6, 2, 4, impl=impl, block_len=4), seed=1)
    x, c0 = torch.randn(3, 13, 6), torch.randn(3, 2, 4)
    want_y, want_c, _ = reference_forward(cell, x, c0, torch.zeros(3, 2, 4))  # float64 on CPU
    y, c_last = cell.to(device)(x.to(device), c0.to(device))
    torch.testing.assert_close(y.cpu().double(), want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_last.cpu().double(), want_c, rtol=1e-5, atol=1e-5)


def test_multi_head_lstm_matches_lstm_cell_reference():
    torch.manual_seed(0)
    cell = randomise(MultiHeadLSTM(6, 2, 4), seed=2)
    x, c0, h0 = torch.randn(3, 13, 6), torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    y, (c_last, h_last) = cell(x, (c0, h0))
    want_y, want_c, want_h = reference_forward(cell, x, c0, h0)
    torch.testing.assert_close(y.double(), want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_last.double(), want_c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_last.double(), want_h, rtol=1e-5, atol=1e-5)


def test_quasi_lstm_gradients_agree_across_implementations(device):
    x = torch.randn(2, 19, 6).to(device)
    grads = {}
    for impl in IMPLS:
        cell = randomise(QuasiLSTM(6, 2, 4, impl=impl, block_len=8), seed=3).to(device)
        x_ = x.clone().requires_grad_()
        y, c_last = cell(x_, torch.ones(2, 2, 4, device=device))
        (y.sin().sum() + c_last.sum()).backward()
        grads[impl] = [x_.grad] + [p.grad for p in cell.parameters()]
    for impl in ["block", "triton"]:
        for got, want in zip(grads[impl], grads["loop"]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_quasi_lstm_two_halves_with_carried_state_equal_whole(impl, device):
    cell = randomise(QuasiLSTM(6, 2, 4, impl=impl, block_len=4), seed=4).to(device)
    x = torch.randn(2, 23, 6).to(device)
    y_whole, c_whole = cell(x)
    y_first, c_first = cell(x[:, :10])
    y_second, c_second = cell(x[:, 10:], c_first)
    torch.testing.assert_close(torch.cat([y_first, y_second], dim=1), y_whole)
    torch.testing.assert_close(c_second, c_whole)


def test_multi_head_lstm_two_halves_with_carried_state_equal_whole():
    cell = randomise(MultiHeadLSTM(6, 2, 4), seed=5)
    x = torch.randn(2, 23, 6)
    y_whole, (c_whole, h_whole) = cell(x)
    y_first, state = cell(x[:, :10])
    y_second, (c_second, h_second) = cell(x[:, 10:], state)
    torch.testing.assert_close(torch.cat([y_first, y_second], dim=1), y_whole)
    torch.testing.assert_close(c_second, c_whole)
    torch.testing.assert_close(h_second, h_whole)


def test_no_state_means_zeros():
    cell = randomise(QuasiLSTM(6, 2, 4), seed=6)
    x = torch.randn(2, 7, 6)
    torch.testing.assert_close(cell(x)[0], cell(x, torch.zeros(2, 2, 4))[0])
    lstm = randomise(MultiHeadLSTM(6, 2, 4), seed=6)
    torch.testing.assert_close(lstm(x)[0], lstm(x, (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))[0])


@pytest.mark.parametrize("cell", [QuasiLSTM(6, 2, 4), MultiHeadLSTM(6, 2, 4)])
def test_bad_shapes_raise_clear_errors(cell):
    with pytest.raises(ValueError, match="d_model=6"):
        cell(torch.randn(2, 5, 7))
    bad_state = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="n_heads, d_head"):
        cell(torch.randn(2, 5, 6), bad_state if isinstance(cell, QuasiLSTM) else (bad_state, bad_state))
