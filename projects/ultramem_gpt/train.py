"""Train and evaluate a GPT for a compute class, e.g. `python projects/ultramem_gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.ultramem_gpt import configs
from projects.ultramem_gpt.model import Model

if __name__ == "__main__":
    main("ultramem_gpt", configs, Model)
