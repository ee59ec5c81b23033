"""The built-in reference trainer: the study's model families under every layout, on PyTorch-native
parallelism (DDP, FSDP2, DTensor TP/SP, torch.distributed.pipelining, all-to-all expert parallelism).

``python -m powertrain.workload.train --spec SPEC`` is one rank (started by ``powertrain run``);
:class:`~powertrain.workload.trainer.Trainer` is the loop; :mod:`~powertrain.workload.parallelize`
applies a layout; :mod:`~powertrain.workload.equivalence` checks a layout against one process.
"""
