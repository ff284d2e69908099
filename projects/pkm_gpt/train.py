"""Train and evaluate a GPT with a product-key memory, e.g. `python projects/pkm_gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.pkm_gpt import configs
from projects.pkm_gpt.model import Model

if __name__ == "__main__":
    main("pkm_gpt", configs, Model)
