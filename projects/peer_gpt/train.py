"""Train and evaluate a GPT with a PEER layer, e.g. `python projects/peer_gpt/train.py --compute_class 6h`."""
from languini.experiment import main
from projects.peer_gpt import configs
from projects.peer_gpt.model import Model

if __name__ == "__main__":
    main("peer_gpt", configs, Model)
