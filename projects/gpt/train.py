"""Train and evaluate a GPT for a compute class, e.g. `python projects/gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.gpt import configs
from projects.gpt.model import Model

if __name__ == "__main__":
    main("gpt", configs, Model)
