"""rayfl's own datasets, registered like a user's: by import path, imported on first use."""

from rayfl.registry import DATASETS

for name, where, config, summary in [
    ("synthetic", "synthetic:load_synthetic", "synthetic:SyntheticConfig", "LEAF / FedProx Synthetic(alpha, beta), generated per device"),
    ("digits", "datasets:load_digits", None, "scikit-learn's 1,797 8x8 UCI digits (bundled, no download)"),
    ("mnist", "datasets:load_official_images", "datasets:OfficialConfig", "MNIST (IDX files in data_dir/mnist)"),
    ("fashion_mnist", "datasets:load_official_images", "datasets:OfficialConfig", "Fashion-MNIST (IDX files in data_dir/fashion_mnist)"),
    ("cifar10", "datasets:load_official_images", "datasets:OfficialConfig", "CIFAR-10 (python batches in data_dir/cifar10)"),
    ("emnist", "natural:load_emnist", "natural:NaturalDataConfig", "TFF's federated EMNIST-62, one client per writer"),
    ("stackoverflow", "natural:load_stackoverflow", "natural:StackOverflowConfig", "TFF's StackOverflow next-word prediction, one client per user"),
    ("gldv2", "natural:load_gldv2", "natural:GLDv2Config", "Google Landmarks v2, one client per photographer"),
]:
    DATASETS.register(name, f"rayfl.data.{where}", config=f"rayfl.data.{config}" if config else "rayfl.config:DataConfig",
                      summary=summary, origin="built-in")

DATASETS.register("ffgg_quadratic", "rayfl.papers.ffgg.quadratic:federated_quadratic",
                  config="rayfl.papers.ffgg.quadratic:QuadraticConfig",
                  summary="FFGG's synthetic quadratic (Example 1), one client per block", origin="built-in")
