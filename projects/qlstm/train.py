"""Train and evaluate a quasi-LSTM for a compute class, e.g. `python projects/qlstm/train.py --compute_class 24h`."""
from languini.experiment import main
from projects.qlstm import configs
from projects.qlstm.model import Model

if __name__ == "__main__":
    main("qlstm", configs, Model)
