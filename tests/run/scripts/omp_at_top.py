"""Sets OMP_NUM_THREADS at its top, before importing torch: torch must see it."""

import os

os.environ["OMP_NUM_THREADS"] = "1"

import torch

print("threads", torch.get_num_threads())
