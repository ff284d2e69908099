"""Train and evaluate a Feedback Transformer for a compute class, e.g.
`python projects/feedback/train.py --compute_class 2m` (on a CPU: the cpu config, two minutes of it)."""
from languini.experiment import main
from projects.feedback import configs
from projects.feedback.model import Model

if __name__ == "__main__":
    main("feedback", configs, Model)
