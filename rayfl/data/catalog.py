"""rayfl's own datasets, registered like a user's: by import path, imported on first use."""

from rayfl.registry import DATASETS

for name, where, config, summary in [
    ("synthetic", "synthetic:load_synthetic", "synthetic:SyntheticConfig", "LEAF / FedProx Synthetic(alpha, beta), generated per device"),
    ("lookalike", "lookalike:load_lookalike", "lookalike:LookalikeConfig", "Offline data shaped like FEMNIST, CIFAR-10 or Shakespeare (benchmarks)"),
    ("digits", "datasets:load_digits", None, "scikit-learn's 1,797 8x8 UCI digits (bundled, no download)"),
    ("mnist", "datasets:load_idx_images", "datasets:OfficialConfig", "MNIST (IDX files in data_dir/mnist)"),
    ("fashion_mnist", "datasets:load_idx_images", "datasets:OfficialConfig", "Fashion-MNIST (IDX files in data_dir/fashion_mnist)"),
    ("cifar10", "datasets:load_cifar10", "datasets:OfficialConfig", "CIFAR-10 (python batches in data_dir/cifar10)"),
    ("emnist", "natural:load_emnist", "natural:NaturalDataConfig", "TFF's federated EMNIST-62, one client per writer"),
    ("stackoverflow", "natural:load_stackoverflow", "natural:StackOverflowConfig", "TFF's StackOverflow next-word prediction, one client per user"),
    ("gldv2", "natural:load_gldv2", "natural:GLDv2Config", "Google Landmarks v2, one client per photographer"),
]:
    DATASETS.register(name, f"rayfl.data.{where}", config=f"rayfl.data.{config}" if config else "rayfl.config:DataConfig",
                      summary=summary, origin="built-in")

DATASETS.register("ffgg_quadratic", "rayfl.papers.ffgg.quadratic:federated_quadratic",
                  config="rayfl.papers.ffgg.quadratic:QuadraticConfig",
                  summary="FFGG's synthetic quadratic (Example 1), one client per block", origin="built-in")

# Data users already have (rayfl.data.tables, rayfl.data.hf): pools any partitioner splits, or
# one client per value of a client column under partition.method: natural.
for name, where, config, summary in [
    ("npz", "tables:load_npz", "tables:NpzConfig", "A NumPy .npz file: arrays x, y (and client ids), optional test file"),
    ("parquet", "tables:load_parquet", "tables:ParquetConfig", "A Parquet table (file, directory or glob; local or URI), read in row batches"),
    ("csv", "tables:load_csv", "tables:CsvConfig", "A CSV table (local or URI), read in blocks"),
    ("hf", "hf:load_hf", "hf:HfConfig", "A Hugging Face dataset: save_to_disk directory, local files or a Hub name"),
]:
    DATASETS.register(name, f"rayfl.data.{where}", config=f"rayfl.data.{config}", summary=summary, origin="built-in")
