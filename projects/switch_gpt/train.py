"""Train and evaluate a Switch GPT for a compute class, e.g. `python projects/switch_gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.switch_gpt import configs
from projects.switch_gpt.model import Model

if __name__ == "__main__":
    main("switch_gpt", configs, Model)
