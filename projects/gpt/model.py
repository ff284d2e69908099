"""GPT-2 style decoder (Languini paper, section 4.2): pre-LayerNorm, learned positions, untied embeddings (tied with
--tie_embeddings). Its building blocks live in languini/transformer.py, shared with every project that is a GPT
with X."""
from languini.transformer import GPT
from projects.gpt.configs import ModelConfig


class Model(GPT):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.tie_embeddings:  # one tensor: what trains or rewrites a row of the output layer moves the input too
            self.head.weight = self.tok_emb.weight
