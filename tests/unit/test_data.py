"""Data without downloads (prototype images, the Markov language and its exact optimum) and the
file formats of --data, built here in miniature."""

import gzip
import struct

import numpy as np
import pytest

from testbed.config import ConfigError, parse_config
from testbed.config.datafiles import (
    CIFAR_RECORD,
    CIFAR_TEST,
    CIFAR_TRAIN,
    load_images,
    load_text,
    probe,
)
from testbed.strategies.registry import SPECS
from testbed.workloads.images import PrototypeImages
from testbed.workloads.language import MarkovLanguage


def test_prototype_images_are_deterministic_balanced_and_split():
    src = PrototypeImages(seed=0, classes=4, samples=1000)
    x, y = src.train(np.arange(400))
    x2, y2 = src.train(np.arange(400))
    np.testing.assert_array_equal(x, x2)
    assert x.shape == (400, 3, 32, 32) and x.dtype == np.float32
    assert np.bincount(y, minlength=4).min() > 60  # about 100 each
    hx, _ = src.heldout(10)
    assert not np.allclose(hx, x[:10])  # the held-out split is other samples


def test_the_markov_language_optimum_is_its_measured_cross_entropy():
    """Monte Carlo: the chain's own conditionals score sampled held-out sequences at L*."""
    lang = MarkovLanguage(seed=2, vocab=12, seq_len=20, samples=100)
    pi = lang.pi
    np.testing.assert_allclose(np.einsum("ab,abc->bc", pi, lang.P), pi, atol=1e-12)  # stationary
    x, y = lang.heldout(4000)
    seq = np.concatenate([x, y[:, -1:]], axis=1)
    marg = pi.sum(axis=1)
    first = -np.log(pi[seq[:, 0], seq[:, 1]] / marg[seq[:, 0]])
    later = -np.log(lang.P[seq[:, :-2], seq[:, 1:-1], seq[:, 2:]])
    nll = np.concatenate([first[:, None], later], axis=1).mean(axis=1)
    assert abs(nll.mean() - lang.optimum) < 4 * nll.std() / np.sqrt(len(nll))
    assert lang.entropy_rate < lang.first_conditional_entropy < np.log(12)


# ---------------------------------------------------------------- tiny files in the real formats


def cifar_folder(tmp_path, per_file=6, bad_label=False):
    rng = np.random.default_rng(0)
    for name in (*CIFAR_TRAIN, CIFAR_TEST):
        rec = rng.integers(0, 256, size=(per_file, CIFAR_RECORD), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, size=per_file)
        if bad_label:
            rec[0, 0] = 12
        (tmp_path / name).write_bytes(rec.tobytes())
    return tmp_path


def mnist_folder(tmp_path, n=7, gz=False):
    rng = np.random.default_rng(1)
    files = {"train": n, "t10k": 3}
    for split, count in files.items():
        images = struct.pack(">IIII", 0x803, count, 28, 28) + rng.integers(0, 256, count * 784, dtype=np.uint8).tobytes()
        labels = struct.pack(">II", 0x801, count) + rng.integers(0, 10, count, dtype=np.uint8).tobytes()
        for kind, data in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
            path = tmp_path / f"{split}-{kind}{'.gz' if gz else ''}"
            path.write_bytes(gzip.compress(data) if gz else data)
    return tmp_path


def test_cifar_binary_folder_reads_back(tmp_path):
    folder = cifar_folder(tmp_path)
    info = probe(str(folder))
    assert (info.kind, info.shape, info.classes, info.train, info.test) == ("cifar10", (3, 32, 32), 10, 30, 6)
    data = load_images(str(folder))
    raw = np.frombuffer((folder / CIFAR_TRAIN[0]).read_bytes(), np.uint8).reshape(-1, CIFAR_RECORD)
    np.testing.assert_array_equal(data.train_x[0].reshape(-1), raw[0, 1:])  # R plane, G, B: 3x32x32
    assert data.train_y[0] == raw[0, 0] and data.train_x.shape == (30, 3, 32, 32)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_folder_reads_back(tmp_path, gz):
    folder = mnist_folder(tmp_path, gz=gz)
    info = probe(str(folder))
    assert (info.kind, info.shape, info.train, info.test) == ("mnist", (1, 28, 28), 7, 3)
    data = load_images(str(folder))
    assert data.train_x.shape == (7, 1, 28, 28) and data.test_y.shape == (3,)


def test_text_reads_back_as_characters(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("héllo wörld, " * 40, encoding="utf-8")
    info = probe(str(path), seq_len=16)
    assert info.kind == "text" and info.vocab == len(set("héllo wörld, "))
    text = load_text(str(path))
    assert "".join(text.chars[i] for i in text.train[:5]) == "héllo"


def run_error(argv):
    with pytest.raises(ConfigError) as info:
        parse_config(argv, SPECS)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_bad_data_is_one_line_naming_the_path_and_the_fix(tmp_path):
    assert "no such file or folder" in run_error(["--workload", "resnet", "--data", str(tmp_path / "none")])
    (tmp_path / "empty").mkdir()
    assert "neither CIFAR-10" in run_error(["--workload", "resnet", "--data", str(tmp_path / "empty")])
    (tmp_path / "cut").mkdir()
    cut = cifar_folder(tmp_path / "cut")
    (cut / CIFAR_TRAIN[2]).write_bytes(b"\0" * 1000)
    msg = run_error(["--workload", "resnet", "--data", str(cut)])
    assert "data_batch_3.bin is 1000 bytes" in msg and "--data" in msg
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"abc\xff\xfe" * 100)
    assert "not UTF-8" in run_error(["--workload", "transformer", "--data", str(binary)])
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    assert "--seq-len" in run_error(["--workload", "transformer", "--data", str(short)])


def test_data_must_suit_its_workload(tmp_path):
    folder = cifar_folder(tmp_path)
    assert "cifar10 data trains --workload resnet, mlp or logreg (got transformer)" in run_error(
        ["--workload", "transformer", "--data", str(folder)])
    assert "fixes it" in run_error(["--workload", "resnet", "--data", str(folder), "--classes", "3"])
    assert "applies to --workload" in run_error(["--workload", "synthetic", "--data", str(folder)])
    cfg = parse_config(["--workload", "mlp", "--data", str(folder)], SPECS)  # pixels in a row
    assert cfg.workload.data == str(folder)


def test_mnist_header_and_label_checks(tmp_path):
    folder = mnist_folder(tmp_path)
    raw = (folder / "train-images-idx3-ubyte").read_bytes()
    (folder / "train-images-idx3-ubyte").write_bytes(struct.pack(">I", 0x999) + raw[4:])
    assert "IDX magic" in run_error(["--workload", "resnet", "--data", str(folder)])
