"""Google Landmarks v2, federated by Hsu et al. (ECCV 2020): one client per Wikipedia user.

Files under `<data_dir>/gldv2/`: the federated split `federated_train.csv` (columns user_id,
image_id, class; TFF's `landmarks-user-160k`) and the images in GLDv2's own layout
`train/<id[0]>/<id[1]>/<id[2]>/<id>.jpg`. FFGG (App. E.2.2) does not use the official test set:
each kept user's images are split, `test_fraction` (0.5) of them into its test set, and a user
is kept when both halves are big enough (`min_client_train` = `min_client_test` = 25 keeps the
823 users with at least 50 images). Labels are renumbered 0..K-1 over the kept users.

Images are decoded with Pillow, converted to RGB and resized to `image_size` squared, and kept
as uint8 [n, 3, S, S] (a quarter of float32's memory; the ResNet scales them to [0, 1])."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from rayfl.data.errors import DatasetError

SPLIT_FILE = "federated_train.csv"
COLUMNS = ("user_id", "image_id", "class")


def read_split(path: Path) -> dict[str, list[tuple[str, int]]]:
    """user -> [(image id, landmark class)] in file order."""
    if not path.is_file():
        raise DatasetError(f"missing {path}: the federated GLDv2 split (columns {', '.join(COLUMNS)})")
    users: dict[str, list[tuple[str, int]]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not set(COLUMNS) <= set(reader.fieldnames):
            raise DatasetError(f"{path}: expected the columns {', '.join(COLUMNS)}, got {reader.fieldnames}")
        for row in reader:
            users.setdefault(row["user_id"], []).append((row["image_id"], int(row["class"])))
    return users


def image_path(root: Path, image_id: str) -> Path:
    """GLDv2's layout: train/a/b/c/abc....jpg."""
    return root / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg"


def load_images(root: Path, image_ids: list[str], size: int) -> np.ndarray:
    """uint8 [n, 3, size, size]."""
    from PIL import Image

    out = np.zeros((len(image_ids), 3, size, size), dtype=np.uint8)
    for i, image_id in enumerate(image_ids):
        path = image_path(root, image_id)
        if not path.is_file():
            raise DatasetError(f"GLDv2 image {image_id} listed in {SPLIT_FILE} is missing at {path}")
        with Image.open(path) as im:
            rgb = im.convert("RGB").resize((size, size), Image.BILINEAR)
            out[i] = np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
    return out
