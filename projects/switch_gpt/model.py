"""A GPT (languini/transformer.py) whose MLP in every other block is a Switch mixture of experts (Fedus et al. 2021;
GShard's top-2 as an option): a float32 router, top-k routing, capacity in training with overflow passed through
the residual, Switch's 0.1 initialisation scale, the load-balancing loss (and an optional router z-loss) returned
as auxiliary losses; optionally Switch layers for the attention's q and shared k/v too (--expert_attention). With
--expert_parallel N under torchrun each process holds n_experts / N experts of every MoE MLP and sends each token
to its expert's process and back (experts_parallel; languini/model_parallel.py)."""
import math
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from languini import model_parallel, parallelize
from languini.transformer import GPT, MLP, causal_attention, check_attention, init_residual_
from projects.switch_gpt.configs import SIZES, ModelConfig, check, moe_blocks
from projects.switch_gpt.ops.moe.naive import experts_naive

class Attention(nn.Module):
    """The GPT's attention (languini/transformer.py), its own here for the experts: with Switch for attention
    (--expert_attention) the q and the shared k/v projections are Switch layers, one router each. Returns (output,
    auxiliary losses)."""

    def __init__(self, cfg: ModelConfig, experts: bool = False):
        super().__init__()
        check_attention(cfg.attention)
        self.n_heads, self.d_head, self.impl = cfg.n_heads, cfg.d_head, cfg.attention
        inner = cfg.n_heads * cfg.d_head
        self.experts = experts
        if experts:  # k and v of a token come from one expert of the k/v layer ("shared keys and values")
            self.q, self.kv = SwitchLinear(cfg, cfg.d_model, inner), SwitchLinear(cfg, cfg.d_model, 2 * inner)
        else:
            self.qkv = nn.Linear(cfg.d_model, 3 * inner)
        self.proj = nn.Linear(inner, cfg.d_model)

    def forward(self, x):
        B, T, _ = x.shape
        if self.experts:
            if torch.is_autocast_enabled(x.device.type) and self.training:
                warnings.warn("Switch attention diverged in bfloat16 in the Switch Transformer paper (appendix A; "
                              "fine in float32): consider --precision fp32.", stacklevel=2)
            (q, q_aux), (kv, kv_aux) = self.q(x), self.kv(x)
            qkv, aux = torch.cat([q, kv], dim=-1), add_losses(q_aux, kv_aux)
        else:
            qkv, aux = self.qkv(x), {}
        q, k, v = qkv.view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        y = causal_attention(q, k, v, self.impl)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1)), aux


def within_capacity(choice: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """(N, k) bool: which choices an expert of `capacity` slots takes. Slots go to first choices in token order,
    then to second choices (GShard), so a token's first choice never loses its slot to another's second."""
    order = choice.t().reshape(-1)  # choice-major: every first choice before any second
    slot = (F.one_hot(order, n_experts).cumsum(0) - 1).gather(1, order[:, None]).squeeze(1)
    return (slot < capacity).view(choice.shape[1], -1).t()


def count_per_expert(index: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How often each expert appears in `index`; a fixed shape (bincount's depends on the data under compile)."""
    return torch.zeros(n_experts, dtype=torch.long, device=index.device).scatter_add_(0, index, torch.ones_like(index))


def truncated_normal_(weight: torch.Tensor, scale: float, fan_in: int) -> None:
    """Switch's initialisation: a normal of std sqrt(scale / fan_in) truncated at two standard deviations."""
    std = math.sqrt(scale / fan_in)
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def add_losses(a: dict, b: dict) -> dict:
    """Auxiliary losses of several Switch layers, summed by name (as Switch sums them over its layers)."""
    return {name: a[name] + b[name] if name in a and name in b else a.get(name, b.get(name)) for name in {**a, **b}}


class SwitchLayer(nn.Module):
    """A Switch layer's router and its bookkeeping: float32 top-k routing, the capacity in training, the expert
    load and the auxiliary losses. Subclasses hold the experts: SwitchMLP (MLPs), SwitchLinear (linear maps)."""

    def __init__(self, cfg: ModelConfig, d_in: int):
        super().__init__()
        E = cfg.n_experts
        self.cfg, self.k = cfg, 2 if cfg.routing == "top2" else 1
        self.router = nn.Linear(d_in, E, bias=False)
        # Expert load, as token-choice counts per expert: in eval mode since reset_memory_stats (per split), and
        # in training since the last train_metrics() (with the choices dropped for capacity).
        self.register_buffer("eval_counts", torch.zeros(E, dtype=torch.long), persistent=False)
        self.register_buffer("train_counts", torch.zeros(E, dtype=torch.long), persistent=False)
        self.register_buffer("train_dropped", torch.zeros((), dtype=torch.long), persistent=False)

    def capacity(self, n_tokens: int) -> int:
        """Slots per expert in training: capacity_factor x k x tokens / E (at least one)."""
        return max(1, int(self.cfg.capacity_factor * self.k * n_tokens / self.cfg.n_experts))

    def route(self, x: torch.Tensor):
        """Router logits and probabilities in float32 (Switch's selective precision, also under autocast), and
        each token's k choices and gates."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float())
            probs = logits.softmax(-1)
            top_p, choice = probs.topk(self.k, dim=-1)
            gates = top_p if self.k == 1 else top_p / top_p.sum(-1, keepdim=True)  # GShard renormalises two
        return logits, probs, choice, gates

    def dispatch(self, x: torch.Tensor):
        """For tokens x (N, d): each choice's expert (-1 where dropped for capacity, in training only), its gate,
        and the auxiliary losses; the expert load counted."""
        E = self.cfg.n_experts
        logits, probs, choice, gates = self.route(x)
        expert_index = choice
        counts = count_per_expert(choice.flatten(), E)
        if self.training:  # no capacity at evaluation: a token's output never depends on other streams there
            keep = within_capacity(choice, E, self.capacity(x.shape[0]))
            expert_index = torch.where(keep, choice, -1)
            if not parallelize.recomputing():  # counted in the forward, not again in its recomputation
                with torch.no_grad():
                    self.train_counts += counts
                    self.train_dropped += (~keep).sum()
        else:
            with torch.no_grad():
                self.eval_counts += counts
        # Switch's load-balancing loss: f_i the share of tokens whose first choice is expert i, P_i the mean
        # router probability of expert i.
        first = count_per_expert(choice[:, 0], E).float() / x.shape[0]
        aux = {"load_balancing": self.cfg.load_balance_coef * E * (first * probs.mean(0)).sum()}
        if self.cfg.router_z_coef:
            aux["router_z"] = self.cfg.router_z_coef * torch.logsumexp(logits, -1).square().mean()
        return expert_index, gates, aux

    def parameters_per_expert(self) -> int:
        """Parameters of one expert (a process may hold only some experts: languini.model_parallel)."""
        held = [p for name, p in self.named_parameters() if not name.startswith("router.")]
        return sum(p.numel() for p in held) // held[0].shape[0]


class SwitchMLP(SwitchLayer):
    """E experts (each a GPT MLP) behind a router; returns (output, auxiliary losses). With expert_parallel > 1
    under torchrun the expert parameters hold this process's experts only (languini.model_parallel.sharding)."""

    def __init__(self, cfg: ModelConfig):
        E, d, h = cfg.n_experts, cfg.d_model, cfg.mlp_ratio * cfg.d_model
        super().__init__(cfg, d)
        shards = model_parallel.shard_group(cfg.expert_parallel, "--expert_parallel")

        def experts_of(*shape):  # this process's experts of a tensor (E, ...)
            return model_parallel.parameter((E, *shape), shards, dim=0, what="n_experts")

        # Expert weights laid out (E, in, out), the grouped GEMM's x @ W.
        self.fc_weight, self.fc_bias = experts_of(d, h), experts_of(h)
        self.proj_weight, self.proj_bias = experts_of(h, d), experts_of(d)
        with torch.no_grad():
            for p in (self.fc_weight, self.fc_bias, self.proj_weight, self.proj_bias):
                p.zero_()  # defined before init_weights (the model's init) draws the weights

    def init_weights(self) -> None:
        s, d, h = self.cfg.init_scale, self.fc_weight.shape[1], self.fc_weight.shape[2]
        truncated_normal_(self.router.weight, s, d)
        # the whole (E, ...) tensors drawn, each process keeping its experts: the same numbers on every layout
        model_parallel.init_(self.fc_weight, lambda t: truncated_normal_(t, s, d))
        model_parallel.init_(self.proj_weight, lambda t: truncated_normal_(t, s, h))
        nn.init.zeros_(self.fc_bias)
        nn.init.zeros_(self.proj_bias)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        expert_index, gates, aux = self.dispatch(x)
        run = experts_parallel if model_parallel.sharding(self.fc_weight) else experts
        out = run(x, expert_index, gates, self.fc_weight, self.fc_bias, self.proj_weight, self.proj_bias,
                  self.cfg.experts_impl)
        return out.view(shape), aux


class SwitchLinear(SwitchLayer):
    """E linear maps d_in -> d_out behind a router (Switch for attention: the q projection, or the shared k/v
    one), routed as SwitchMLP; the experts run as a loop over experts on every device. Returns (output,
    auxiliary losses); a choice dropped for capacity contributes 0."""

    def __init__(self, cfg: ModelConfig, d_in: int, d_out: int):
        super().__init__(cfg, d_in)
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(cfg.n_experts, d_out))

    def init_weights(self) -> None:
        truncated_normal_(self.router.weight, self.cfg.init_scale, self.weight.shape[1])
        truncated_normal_(self.weight, self.cfg.init_scale, self.weight.shape[1])
        nn.init.zeros_(self.bias)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        expert_index, gates, aux = self.dispatch(x)
        out = x.new_zeros(x.shape[0], self.weight.shape[2])
        for e, (w, b) in enumerate(zip(self.weight.unbind(0), self.bias.unbind(0))):
            token, choice = (expert_index == e).nonzero(as_tuple=True)
            out = out.index_add(0, token, ((x[token] @ w + b) * gates[token, choice, None]).to(out.dtype))
        return out.view(*shape[:-1], -1), aux


def experts(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias, impl: str):
    """The experts through the per-expert loop (CPU) or the grouped Triton kernel (GPU)."""
    if impl == "triton" or (impl == "auto" and x.is_cuda):
        from projects.switch_gpt.ops.moe.triton import experts_grouped

        return experts_grouped(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias)
    return experts_naive(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias)


@torch.compiler.disable  # collectives with counts known only at run time: nothing for torch.compile to trace
def experts_parallel(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias, impl: str):
    """experts() where the expert parameters hold only this process's experts of a group (model_parallel):
    the kept choices, grouped by expert and so by the process holding it, go there with an all-to-all (how many
    each process sends exchanged first), pass its local experts (the loop or the grouped kernel), come back with
    the reverse all-to-all, and are weighted by their gates here. Capacity was applied to this process's tokens."""
    shards, E_local, k = model_parallel.sharding(fc_weight).shards, fc_weight.shape[0], expert_index.shape[1]
    choice = expert_index.reshape(-1)
    kept = (choice >= 0).nonzero().squeeze(1)
    order = torch.argsort(choice[kept], stable=True)
    kept, expert = kept[order], choice[kept][order]
    send = count_per_expert(expert // E_local, shards.size)
    recv = model_parallel.exchange_counts(send, shards.group)
    send = send.tolist()
    rows = model_parallel.all_to_all(x[kept // k], send, recv, shards.group)
    local = model_parallel.all_to_all((expert % E_local)[:, None], send, recv, shards.group)
    if rows.shape[0]:
        y = experts(rows, local, torch.ones(local.shape, device=x.device), fc_weight, fc_bias, proj_weight,
                    proj_bias, impl)
    else:  # no token for these experts: no kernel launch, and the backward still joins the group's all-to-all
        y = rows * 0
    y = model_parallel.all_to_all(y, recv, send, shards.group)
    return torch.zeros_like(x).index_add(0, kept // k, (y * gates.reshape(-1)[kept, None]).to(x.dtype))


class Block(nn.Module):
    """The GPT's pre-LayerNorm block (languini/transformer.py), its own here to carry the auxiliary losses."""

    def __init__(self, cfg: ModelConfig, moe: bool):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg, experts=moe and cfg.expert_attention)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), (SwitchMLP(cfg) if moe else MLP(cfg.d_model, cfg.mlp_ratio))

    def forward(self, x):
        y, aux = self.attn(self.ln1(x))
        x = x + y
        if isinstance(self.mlp, SwitchMLP):
            y, mlp_aux = self.mlp(self.ln2(x))
            return x + y, add_losses(aux, mlp_aux)  # a dropped token's y is 0: the residual passes it through
        return x + self.mlp(self.ln2(x)), aux


class Model(GPT):
    def __init__(self, cfg: ModelConfig):
        check(cfg)
        moe = set(moe_blocks(cfg))
        super().__init__(cfg, lambda i: Block(cfg, i in moe))

    def init_block(self, block: Block) -> None:
        """Switch's init for the Switch layers; GPT-2's depth-scaled residual write for a dense MLP."""
        if block.attn.experts:
            block.attn.q.init_weights()
            block.attn.kv.init_weights()
        if isinstance(block.mlp, SwitchMLP):
            block.mlp.init_weights()
        else:
            init_residual_(block.mlp.proj, self.cfg.n_layers)

    def switch_layers(self) -> dict[str, SwitchLayer]:
        """Every Switch layer by name: block_<i> the MLP of block i, block_<i>_q and block_<i>_kv its attention's."""
        layers = {}
        for i, block in enumerate(self.blocks):
            if block.attn.experts:
                layers.update({f"block_{i}_q": block.attn.q, f"block_{i}_kv": block.attn.kv})
            if isinstance(block.mlp, SwitchMLP):
                layers[f"block_{i}"] = block.mlp
        return layers

    def forward(self, x, state=None):
        h = self.embed(x)
        aux = {}
        for block in self.blocks:
            h, block_aux = block(h)
            aux = add_losses(aux, block_aux)
        return self.head(self.ln_f(h)), None, aux

    def active_parameters(self) -> int:
        """Parameters a token passes through: all but the experts it is not routed to."""
        total = model_parallel.parameter_count(self)
        for layer in self.switch_layers().values():
            total -= (layer.cfg.n_experts - layer.k) * layer.parameters_per_expert()
        return total

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs at batch 1 that DeepSpeed's profiler misses: on the Triton path (GPU) the experts, as
        the profiler counts the loop's (2 FLOPs per multiply-add, 1 per GELU), for k choices of every token
        (the nominal count: the overflow of a training batch is not subtracted). The loop (CPU) it sees."""
        uses_kernel = self.cfg.experts_impl == "triton" or (self.cfg.experts_impl == "auto"
                                                             and self.head.weight.is_cuda)
        if not uses_kernel:
            return 0
        d, h = self.cfg.d_model, self.cfg.mlp_ratio * self.cfg.d_model
        return sum(layer.k * seq_len * (4 * d * h + h) for layer in self.switch_layers().values()
                   if isinstance(layer, SwitchMLP))  # Switch attention's experts are a loop the profiler sees

    # -- expert load (memory statistics) ----------------------------------------------------------------
    def reset_memory_stats(self) -> None:
        """Start counting the expert load of every forward pass in eval mode until the next reset."""
        for layer in self.switch_layers().values():
            layer.eval_counts.zero_()

    def memory_stats(self) -> dict:
        """Per Switch layer, the share of token choices per expert and its coefficient of variation (std / mean,
        0 for a perfectly balanced load) since reset_memory_stats, over the tokens of every process (each must
        call it); and the mean CV over blocks."""
        stats = {name: load_stats(all_processes(layer.eval_counts)) for name, layer in self.switch_layers().items()}
        return {"expert_load": stats, "mean_cv": sum(s["cv"] for s in stats.values()) / len(stats)}

    def train_metrics(self) -> dict:
        """Logged in the training rows: the share of token choices dropped for capacity, and the mean CV of the
        expert load, over the training steps since the last call (then reset)."""
        layers = self.switch_layers().values()
        choices = sum(int(layer.train_counts.sum()) for layer in layers)
        dropped = sum(int(layer.train_dropped) for layer in layers)
        cv = sum(load_stats(layer.train_counts)["cv"] for layer in layers) / len(layers)
        for layer in layers:
            layer.train_counts.zero_()
            layer.train_dropped.zero_()
        return {"moe_drop_rate": dropped / choices if choices else 0.0, "moe_load_cv": cv}


def all_processes(counts: torch.Tensor) -> torch.Tensor:
    """The counts of every process summed, as a copy (asking twice must not sum twice); themselves when not
    distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return counts
    total = counts.clone()
    dist.all_reduce(total)
    return total


def load_stats(counts: torch.Tensor) -> dict:
    counts = counts.double().cpu()
    total = counts.sum()
    if total == 0:
        return {"share": [0.0] * len(counts), "cv": 0.0, "tokens": 0}
    return {"share": (counts / total).tolist(), "cv": (counts.std(correction=0) / counts.mean()).item(),
            "tokens": int(total)}


if __name__ == "__main__":  # every config's parameter count (the README's table)
    print(f"{'config':<10} {'E':>3} {'MoE blocks':>10} {'parameters':>14} {'active per token':>17}")
    for name, cfg in SIZES.items():
        with torch.device("meta"):
            model = Model(cfg)
        total = sum(p.numel() for p in model.parameters())
        print(f"{name:<10} {cfg.n_experts:>3} {len(moe_blocks(cfg)):>10} {total / 1e6:>13.1f}M "
              f"{model.active_parameters() / 1e6:>16.1f}M")
