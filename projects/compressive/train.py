"""Train and evaluate a Compressive Transformer (or a Transformer-XL, `--cmem_len 0`) for a compute class, e.g.
`python projects/compressive/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.compressive import configs
from projects.compressive.model import Model

if __name__ == "__main__":
    main("compressive", configs, Model)
