"""Train and evaluate a GPT with the lattice memory, e.g. `python projects/lram_gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.lram_gpt import configs
from projects.lram_gpt.model import Model

if __name__ == "__main__":
    main("lram_gpt", configs, Model)
