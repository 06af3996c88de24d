"""Hugging Face datasets as rayfl datasets: `save_to_disk` directories (Dataset and
DatasetDict) with `Image()` features built from small PIL images, texts with a tokenizer named
by import path, local Parquet files through `data_files`; values checked against what was
written, with iid, dirichlet and natural (client column) partitions, and every mistake one
ConfigError line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from PIL import Image  # noqa: E402

from rayfl.config import ConfigError, load_config  # noqa: E402
from rayfl.data import build_federated_dataset  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
H, W = 3, 5  # not square, so a swapped height and width shows


@pytest.fixture(autouse=True)
def quiet_progress_bars():
    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()


def image(i: int, rgb: bool = False, h: int = H, w: int = W) -> Image.Image:
    """Image i (< 240): pixel (r, c) = i + 2 r + c (green + 100, blue + 150 in colour, mod 256)."""
    base = i + 2 * np.arange(h)[:, None] + np.arange(w)[None, :]
    arr = (np.stack([base, base + 100, base + 150] if rgb else [base], axis=-1) % 256).astype(np.uint8)
    return Image.fromarray(arr if rgb else arr[..., 0])


def pixels(i: int, rgb: bool = False) -> np.ndarray:
    """What image i must decode to: float32 [C, H, W] in [0, 1]."""
    arr = np.asarray(image(i, rgb), dtype=np.float32) / 255
    return arr.transpose(2, 0, 1) if rgb else arr[None]


def image_dataset(ids: list[int], rgb: bool = False, labels=None, writers=None) -> datasets.Dataset:
    features = datasets.Features({
        "img": datasets.Image(),
        "label": datasets.ClassLabel(names=["cat", "dog", "emu"]),
        "writer": datasets.Value("string"),
    })
    return datasets.Dataset.from_dict({
        "img": [image(i, rgb) for i in ids],
        "label": [i % 3 for i in ids] if labels is None else labels,
        "writer": [f"w{i % 4}" for i in ids] if writers is None else writers,
    }, features=features)


def image_ids(x: np.ndarray) -> np.ndarray:
    """Which image each decoded sample is (its top-left pixel is i)."""
    return np.round(x[:, 0, 0, 0] * 255).astype(int)


def cfg_of(path, *extra: str, method: str = "iid", clients: int | None = 3):
    overrides = ["data.dataset=hf", f"partition.method={method}",
                 f"partition.num_clients={'null' if clients is None else clients}", "algorithm.clients_per_round=1"]
    if path is not None:
        overrides.append(f"data.path={path}")
    if method == "dirichlet":
        overrides.append("partition.min_size=1")
    return load_config(None, [*overrides, *extra])


def build(cfg):
    return build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)


def one_line_error(make, match: str) -> str:
    """The ConfigError a config raises when made (a callable) or built: one line, matching."""
    with pytest.raises(ConfigError) as err:
        build(make() if callable(make) else make)
    text = str(err.value)
    assert "\n" not in text and match in text, text
    return text


@pytest.fixture
def saved_dict(tmp_path: Path) -> Path:
    """A DatasetDict on disk: 24 train images (ids 0..23) and 6 test images (ids 100..105)."""
    path = tmp_path / "images"
    datasets.DatasetDict(train=image_dataset(list(range(24))), test=image_dataset(list(range(100, 106)))).save_to_disk(str(path))
    return path


# --------------------------------------------------------------------------- images


def test_saved_dataset_dict_images_decode_to_chw_with_its_splits(saved_dict):
    fd = build(cfg_of(saved_dict, "data.test_split=test", "data.image_column=img"))
    assert fd.input_shape == (1, H, W) and fd.train_x.dtype == np.float32 and fd.num_classes == 3
    train, test = image_ids(fd.train_x), image_ids(fd.test_x)
    np.testing.assert_array_equal(train, np.arange(24))  # the train split, in order
    np.testing.assert_array_equal(test, np.arange(100, 106))  # the test split, in order
    np.testing.assert_allclose(fd.train_x, np.stack([pixels(i) for i in train]), atol=1e-7)
    np.testing.assert_array_equal(fd.train_y, train % 3)
    np.testing.assert_array_equal(fd.test_y, test % 3)
    assert fd.train_y.flags.writeable and fd.train_x.flags.writeable


def test_natural_clients_are_their_writers_rows(saved_dict):
    fd = build(cfg_of(saved_dict, "data.test_split=test", "data.client_column=writer", method="natural", clients=None))
    assert fd.num_clients == 4
    train, test = image_ids(fd.train_x), image_ids(fd.test_x)
    for k in range(4):  # writers w0..w3 in sorted order
        assert set(train[fd.client_train[k]]) == {i for i in range(24) if i % 4 == k}
        assert set(test[fd.client_test[k]]) == {i for i in range(100, 106) if i % 4 == k}


def test_one_dataset_is_split_by_test_fraction_with_every_partitioner(tmp_path):
    path = tmp_path / "one"
    image_dataset(list(range(40)), rgb=True).save_to_disk(str(path))
    for method, extra in (("iid", []), ("dirichlet", ["partition.alpha=0.5"])):
        fd = build(cfg_of(path, "data.client_column=writer", *extra, method=method, clients=4))
        assert fd.input_shape == (3, H, W)
        ids = np.concatenate([image_ids(fd.train_x), image_ids(fd.test_x)])
        assert sorted(ids.tolist()) == list(range(40)) and len(fd.test_y) == 8
        for k, i in enumerate(image_ids(fd.train_x)):
            np.testing.assert_allclose(fd.train_x[k], pixels(i, rgb=True), atol=1e-7)
        np.testing.assert_array_equal(fd.train_y, image_ids(fd.train_x) % 3)
        assert sorted(np.concatenate(fd.client_train).tolist()) == list(range(len(fd.train_y)))
    capped = build(cfg_of(path, "data.image_column=img", "data.max_samples=15"))
    assert len(capped.train_y) + len(capped.test_y) == 15


def test_images_of_different_sizes_are_one_line(tmp_path):
    ds = image_dataset(list(range(6)))
    odd = datasets.Dataset.from_dict({"img": [image(7, h=4, w=4)], "label": [1], "writer": ["w9"]}, features=ds.features)
    path = tmp_path / "odd"
    datasets.concatenate_datasets([ds, odd]).save_to_disk(str(path))
    one_line_error(cfg_of(path, "data.image_column=img"), "data.image_column: images of column 'img' differ in size: row 6")


# --------------------------------------------------------------------------- texts and numbers


TOKENIZERS = '''
import numpy as np

def letters(text):
    """a -> 1, b -> 2, ...: one id per letter."""
    return [ord(c) - 96 for c in text]

def as_array(text):
    return np.array([len(text), 7, 7, 7, 7, 7], dtype=np.int32)

def negative(text):
    return [-1]

not_callable = 3
'''


@pytest.fixture
def tokenizers(tmp_path: Path, monkeypatch) -> str:
    """A module of tokenizers importable as `hf_test_tokenizers`."""
    (tmp_path / "hf_test_tokenizers.py").write_text(TOKENIZERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hf_test_tokenizers"


def test_texts_become_padded_token_ids(tmp_path, tokenizers):
    texts = ["abc", "hello", "z", "federated", "ab", "ba"] * 4
    path = tmp_path / "texts"
    datasets.Dataset.from_dict({"text": texts, "label": ["pos", "neg"] * 12, "user": list(range(24))}).save_to_disk(str(path))
    fd = build(cfg_of(path, "data.text_column=text", f"data.tokenizer={tokenizers}:letters", "data.seq_len=4"))
    assert fd.input_shape == (4,) and fd.train_x.dtype == np.int64 and fd.num_classes == 2
    want = {t: (([ord(c) - 96 for c in t] + [0] * 4)[:4]) for t in set(texts)}  # padded with 0, truncated
    rows = {tuple(v): t for t, v in want.items()}
    for x, y in zip(fd.train_x, fd.train_y, strict=True):
        text = rows[tuple(x.tolist())]
        assert y == (0 if text in ("hello", "federated", "ba") else 1)  # neg < pos: odd rows are neg
    arrays = build(cfg_of(path, "data.text_column=text", f"data.tokenizer={tokenizers}:as_array", "data.seq_len=3"))
    assert {tuple(r) for r in arrays.train_x.tolist()} <= {(len(t), 7, 7) for t in texts}


def test_numeric_columns_and_string_labels(tmp_path):
    n = 30
    path = tmp_path / "numbers"
    datasets.Dataset.from_dict({"a": np.arange(n, dtype=np.float32), "b": np.arange(n) * 2.0,
                                "label": [["zebra", "ant", "mole"][i % 3] for i in range(n)]}).save_to_disk(str(path))
    fd = build(cfg_of(path, method="dirichlet", clients=3))
    ids = fd.train_x[:, 0].astype(int)
    np.testing.assert_array_equal(fd.train_x[:, 1], ids * 2.0)
    np.testing.assert_array_equal(fd.train_y, [{0: 2, 1: 0, 2: 1}[i % 3] for i in ids])  # ant, mole, zebra


def test_local_parquet_files_through_data_files(tmp_path):
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    image_dataset(list(range(12))).to_parquet(str(train))
    image_dataset(list(range(50, 55))).to_parquet(str(test))
    fd = build(cfg_of(None, f"data.data_files={{train: {train}, test: [{test}]}}", "data.test_split=test",
                      f"data.cache_dir={tmp_path / 'cache'}", "data.image_column=img"))
    np.testing.assert_array_equal(image_ids(fd.train_x), np.arange(12))
    np.testing.assert_array_equal(image_ids(fd.test_x), np.arange(50, 55))
    np.testing.assert_allclose(fd.test_x, np.stack([pixels(i) for i in range(50, 55)]), atol=1e-7)


# --------------------------------------------------------------------------- mistakes


def test_every_mistake_is_one_line(saved_dict, tmp_path, tokenizers, monkeypatch):
    one_line_error(lambda: cfg_of(tmp_path / "missing"), f"data.path: {tmp_path / 'missing'} does not exist")
    text = one_line_error(cfg_of(saved_dict, "data.split=training"), "data.split: ")
    assert "has no split 'training'" in text
    assert "['train', 'test']" in text
    one_line_error(cfg_of(saved_dict, "data.label_column=target"), "data.label_column: column 'target' is not in")
    one_line_error(cfg_of(saved_dict, "data.client_column=user"), "data.client_column: column 'user' is not in")
    one_line_error(lambda: cfg_of(saved_dict, method="natural", clients=None), "partition.method:")
    one_class = tmp_path / "one_class"
    image_dataset(list(range(6)), labels=[1] * 6).save_to_disk(str(one_class))
    one_line_error(cfg_of(one_class, "data.image_column=img"), "has 1 class")
    unlabelled = tmp_path / "unlabelled"
    image_dataset(list(range(6)), labels=[0, 1, 2, -1, 0, 1]).save_to_disk(str(unlabelled))
    one_line_error(cfg_of(unlabelled, "data.image_column=img"), "holds label -1, not a class code in [0, 3)")
    single = tmp_path / "single"
    image_dataset(list(range(6))).save_to_disk(str(single))
    one_line_error(cfg_of(single, "data.image_column=img", "data.test_split=test"), "data.test_split: ")
    one_line_error(cfg_of(single), "data.feature_columns: column 'img'")  # img and writer are no numbers
    for bad in ("no_such_module:letters", f"{tokenizers}:nothing", "not a path", f"{tokenizers}:not_callable"):
        one_line_error(lambda bad=bad: cfg_of(single, "data.text_column=writer", f"data.tokenizer={bad}"), "data.tokenizer: ")
    one_line_error(cfg_of(single, "data.text_column=writer", f"data.tokenizer={tokenizers}:negative"), "data.tokenizer: ")
    one_line_error(lambda: cfg_of(single, "data.text_column=writer"), "data.tokenizer: ")
    one_line_error(lambda: cfg_of(single, "data.image_column=img", "data.shape=[1,15]"), "data.shape: ")
    one_line_error(lambda: cfg_of(None), "data.path: set one of")


def test_a_hub_name_without_network_is_one_line(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    text = one_line_error(cfg_of("someone/no-such-dataset", f"data.cache_dir={tmp_path}"), "data.path: 'someone/no-such-dataset' is not a local path")
    assert "Hub" in text


def test_without_datasets_installed_the_error_says_pip_install(monkeypatch, saved_dict):
    from rayfl.data.hf import HfConfig, load_hf

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails as if not installed
    one_line_error(lambda: cfg_of(saved_dict), "data.dataset: the hf dataset needs Hugging Face datasets: pip install datasets")
    with pytest.raises(ConfigError, match="pip install datasets"):
        load_hf(HfConfig(path=str(saved_dict)), 0)


def test_import_rayfl_does_not_import_datasets():
    code = textwrap.dedent("""
        import sys
        import rayfl, rayfl.data, rayfl.data.catalog, rayfl.data.hf, rayfl.data.tables
        from rayfl.registry import DATASETS
        assert {"npz", "parquet", "csv", "hf"} <= set(DATASETS.names())
        assert "datasets" not in sys.modules, "datasets was imported"
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]


# --------------------------------------------------------------------------- training


def test_fedavg_trains_on_a_hugging_face_image_dataset(ray_local, tmp_path):
    """A few rounds of FedAvg on dark / bright images under a Dirichlet split."""
    from rayfl.results import load
    from rayfl.runner import run_experiment

    rng = np.random.default_rng(0)
    labels = [i % 2 for i in range(80)]
    imgs = [Image.fromarray((rng.random((6, 6)) * 100 + 150 * y).astype(np.uint8)) for y in labels]
    path = tmp_path / "bright"
    datasets.Dataset.from_dict({"image": imgs, "label": labels},
                               features=datasets.Features({"image": datasets.Image(),
                                                           "label": datasets.ClassLabel(names=["dark", "bright"])})
                               ).save_to_disk(str(path))
    cfg = cfg_of(path, "partition.alpha=0.5", "run.rounds=3", "algorithm.clients_per_round=4", "algorithm.lr=0.5",
                 f"output.dir={tmp_path / 'results'}", method="dirichlet", clients=4)
    res = load(run_experiment(cfg).run_dir)
    rounds = res.rounds.sort_values("round")
    assert rounds["round"].tolist() == [0, 1, 2]
    accuracy = rounds["test_accuracy"].dropna()
    assert len(accuracy) and np.isfinite(accuracy).all() and accuracy.iloc[-1] > 0.5
