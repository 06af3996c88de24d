"""The data layer: centralised datasets, partitioners and the federated view the engine uses."""

from rayfl.data.datasets import ArrayDataset, DatasetError, load_pool
from rayfl.data.federated import FederatedDataset, build_federated_dataset

__all__ = ["ArrayDataset", "DatasetError", "FederatedDataset", "build_federated_dataset", "load_pool"]
