"""Ray Train: a ``TorchTrainer`` (a Ray Train v2 ``DataParallelTrainer`` with torch's backend) whose
``train_loop_per_worker`` runs in Ray's worker processes, each profiled as a rank of a job,
the ranks' reports merged on rank 0 as a torchrun job's are and handed to the driver
(NOTE [ Ray Train's workers profiled ] in worker.py).

It records no loader of its own: inside each worker the loop's input is a DataLoader
(``ray.train.torch.prepare_data_loader`` gives one) or a Ray Data shard
(``ray.train.get_dataset_shard(...).iter_torch_batches()``), which the torch and Ray Data
adapters time there as anywhere. Nothing here imports Ray until the user's code imports
Ray Train's trainer.
"""

from __future__ import annotations

from .. import Adapter

ADAPTER = Adapter(
    name="ray.train",
    imports=("ray.train.v2.api.data_parallel_trainer",),
    hooks="loadprof.frameworks.raytrain.hooks:RayTrainHooks",
    label="Ray Train",
    dialect="torch",
)
