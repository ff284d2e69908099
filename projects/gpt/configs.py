"""GPT sizes (Languini paper, Table 4) and the best run of each compute class (Table 6)."""
from dataclasses import dataclass, replace

from languini import transformer
from languini.flags import arg


@dataclass
class ModelConfig(transformer.GPTConfig):
    tie_embeddings: bool = arg(False, "one matrix for the input embedding and the output layer (the Hebbian "
                                      "Softmax's language models tie them, Rae's thesis 4.3.2); false: two, as the "
                                      "Languini paper")


SIZES = {**transformer.sizes(ModelConfig), "cpu": ModelConfig(**transformer.CPU_SIZE)}

COMPUTE_CLASSES = transformer.compute_classes()


def get(name: str, **overrides) -> ModelConfig:
    if name not in SIZES:
        raise ValueError(f"Unknown GPT config '{name}'; choose one of {', '.join(SIZES)}.")
    return replace(SIZES[name], **overrides)
