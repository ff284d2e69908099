"""Train and evaluate a Shortformer for a compute class, e.g. `python projects/shortformer/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.shortformer import configs
from projects.shortformer.model import Model

if __name__ == "__main__":
    main("shortformer", configs, Model)
