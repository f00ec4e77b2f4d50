"""Bad --data found before Ray starts: every label, each file's length and a .gz to its end are
checked by validation, so `testbed.run` exits 2 with one line naming the file, the record and the
fix (before, a worker found them: Ray started, tracebacks, exit 1, `ActorDiedError`)."""

import gzip
import struct

import numpy as np
import pytest

from testbed import run
from testbed.config.datafiles import CIFAR_RECORD, CIFAR_TEST, CIFAR_TRAIN, probe


def cifar(folder, per_file=4):
    rng = np.random.default_rng(0)
    for name in (*CIFAR_TRAIN, CIFAR_TEST):
        rec = rng.integers(0, 256, size=(per_file, CIFAR_RECORD), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, size=per_file)
        (folder / name).write_bytes(rec.tobytes())
    return folder


def mnist(folder, train=5, test=3, gz=False, label=None):
    rng = np.random.default_rng(1)
    for split, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        if label is not None and split == "train":
            labels[-1] = label
        files = {"images-idx3-ubyte": struct.pack(">IIII", 0x803, count, 28, 28)
                 + rng.integers(0, 256, count * 784, dtype=np.uint8).tobytes(),
                 "labels-idx1-ubyte": struct.pack(">II", 0x801, count) + labels.tobytes()}
        for kind, data in files.items():
            path = folder / f"{split}-{kind}{'.gz' if gz else ''}"
            path.write_bytes(gzip.compress(data) if gz else data)
    return folder


def refused(capsys, folder, workload="resnet"):
    code = run.main(["--workload", workload, "--data", str(folder), "--steps", "1", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("testbed.run: error: --data ") and "download" in err
    return err


def test_a_cifar_label_past_the_first_record(tmp_path, capsys):
    folder = cifar(tmp_path)
    path = folder / CIFAR_TRAIN[3]
    raw = bytearray(path.read_bytes())
    raw[2 * CIFAR_RECORD] = 200  # record 2's label byte
    path.write_bytes(bytes(raw))
    assert f"{path}: record 2 has label 200, not 0..9" in refused(capsys, folder)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_labels_out_of_range(tmp_path, capsys, gz):
    folder = mnist(tmp_path, gz=gz, label=77)
    err = refused(capsys, folder)
    assert "train-labels-idx1-ubyte" in err and "record 4 has label 77, not 0..9" in err


def test_a_truncated_gz(tmp_path, capsys):
    folder = mnist(tmp_path, gz=True)
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    err = refused(capsys, folder)
    assert str(path) in err and "cannot be decompressed to its end" in err


def test_an_mnist_file_of_zero_images(tmp_path, capsys):
    folder = mnist(tmp_path, train=0)
    err = refused(capsys, folder)
    assert "train-images-idx3-ubyte holds 0 images" in err


def test_good_files_still_probe(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "m").mkdir()
    assert probe(str(cifar(tmp_path / "c"))).train == 20
    assert probe(str(mnist(tmp_path / "m", gz=True))).test == 3
