"""The lattice memory read: naive.py (the PyTorch reference, also the CPU path) and triton.py (the kernels);
memory.theta picks between them."""
