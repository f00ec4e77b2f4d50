"""Tiny configurations of each workload, as config overrides, for the checks a strategy declares
(`testbed.strategies.contract.Equivalence`): small enough that a run of a few workers takes seconds.

SYN, the torch-free synthetic gradient, depends on the parameters (w - w* plus seeded noise per
worker and iteration), so it checks averaging and replica consistency as a real model does
without each actor importing torch. The real architectures (RESNET with its batch-norm rule,
LM the transformer) cover the autograd path; each torch worker costs a process that imports torch,
so a strategy meets them once or twice. PROFILE buckets ResNet-50's 161 tensors by their real
sizes at 1/10000 of them. Pure data.
"""

SYN = {"workload.name": "synthetic", "workload.grad_mb": 0.01, "workload.compute_ms": 0.0}
SMALL_BUCKETS = {**SYN, "ring.bucket_mb": 0.004}  # 8 tensors of 328 floats: 2 tensors a bucket
PROFILE = {"workload.name": "profile:resnet50", "workload.payload": "scaled:0.0001",
           "workload.compute_ms": 0.0, "workload.grad_mb": 4.0}  # 4.0: the default, as the profile asks
RESNET = {"workload.name": "resnet", "workload.width": 4}
LM = {"workload.name": "transformer", "workload.d_model": 16, "workload.layers": 1, "workload.heads": 2,
      "workload.seq_len": 16, "workload.vocab": 16}
# Adam at lr 1e-3: it divides by sqrt(v), so where a gradient is near zero another order of
# summation moves an element by up to a whole step (lr); at 1e-2 one element in 4k left atol 1e-5.
RESNET_SGD = {**RESNET, "workload.optimizer": "sgd", "workload.lr": 0.1}
RESNET_ADAM = {**RESNET, "workload.optimizer": "adam", "workload.lr": 0.001}
LM_ADAM = {**LM, "workload.optimizer": "adam", "workload.lr": 0.001}
