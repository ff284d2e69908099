"""Train and evaluate SAM as a language model for a compute class, e.g. `python projects/sam/train.py
--compute_class 2m` (on a CPU: the `cpu` config, its memory carried across the segments of each stream)."""
from languini.experiment import main
from projects.sam import configs
from projects.sam.model import Model

if __name__ == "__main__":
    main("sam", configs, Model)
