"""`--data PATH`: the file formats a run trains on, probed before Ray starts and read by workers.

    CIFAR-10, binary version   a folder with data_batch_1.bin .. data_batch_5.bin and test_batch.bin
                               (or the cifar-10-batches-bin folder inside it); each record is one
                               label byte (0..9) then 3072 pixel bytes: 1024 red, 1024 green, 1024
                               blue, each a row-major 32x32 plane
    MNIST, IDX files           a folder with train-images-idx3-ubyte, train-labels-idx1-ubyte,
                               t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each may be .gz):
                               a big-endian header -- magic 0x00000803, count, rows, cols for images;
                               0x00000801, count for labels -- then one unsigned byte per value
    UTF-8 text                 any other regular file: a character-level language model over the
                               characters it holds; the last tenth is the held-out split

Nothing is unpickled. Uncompressed files are memory-mapped, so the workers of one machine share
one copy in the page cache. `probe` checks everything a worker would trip on, before Ray starts:
each file's header and length, at least one image per split, and every label (one pass over the
label bytes, under a second for CIFAR-10; a `.gz` is decompressed once to its end, so a truncated
one is caught). Every problem is a ValueError whose text names the file, the record where one is
at fault, and what to give instead. Pure: numpy only.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST = "test_batch.bin"
MNIST_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
               "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
TEXT_HELD_OUT = 0.1  # the last tenth of a text file is held out
WHAT = "give a CIFAR-10 binary folder, an MNIST IDX folder or a UTF-8 text file"


@dataclass(frozen=True)
class DataInfo:
    """What a --data path holds, as far as validation needs it."""

    kind: str  # "cifar10", "mnist" or "text"
    shape: tuple[int, ...] | None  # one image (C, H, W); None for text
    classes: int | None
    train: int  # training images, or characters of the training split
    test: int  # held-out images, or characters of the held-out split
    vocab: int | None = None  # distinct characters (text)

    @property
    def images(self) -> bool:
        return self.kind != "text"


@dataclass(frozen=True)
class Images:
    """uint8 images (n, C, H, W) and int64 labels, training and held-out."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: int


@dataclass(frozen=True)
class Text:
    """A text as character ids: `train` and `test` (int64), and the characters behind the ids."""

    train: np.ndarray
    test: np.ndarray
    chars: str


# ---------------------------------------------------------------- probing (validation)


def probe(path: str, seq_len: int = 2) -> DataInfo:
    """What `path` holds; ValueError (the message: what is wrong, what to give) if it is no format
    of the table above. `seq_len`: a text must hold a training and a held-out sequence."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file or folder; {WHAT}")
    if p.is_dir():
        folder = _cifar_folder(p)
        if folder is not None:
            return _probe_cifar(folder)
        if _mnist_paths(p) is not None:
            return _probe_mnist(p)
        raise ValueError(f"holds neither CIFAR-10 binary files ({CIFAR_TRAIN[0]} .. {CIFAR_TEST}) nor MNIST IDX "
                         f"files ({MNIST_FILES['train_x']}, ...); {WHAT}")
    if not p.is_file():
        raise ValueError(f"is not a regular file or a folder; {WHAT}")
    return _probe_text(p, seq_len)


def _cifar_folder(p: Path) -> Path | None:
    for folder in (p, p / "cifar-10-batches-bin"):
        if any((folder / n).exists() for n in (*CIFAR_TRAIN, CIFAR_TEST)):
            return folder
    return None


def _probe_cifar(folder: Path) -> DataInfo:
    counts = {}
    for name in (*CIFAR_TRAIN, CIFAR_TEST):
        f = folder / name
        if not f.is_file():
            raise ValueError(f"{f} is missing (CIFAR-10 binary needs {', '.join(CIFAR_TRAIN)} and {CIFAR_TEST}); "
                             "download the binary version again")
        size = f.stat().st_size
        if size == 0 or size % CIFAR_RECORD:
            raise ValueError(f"{f} is {size} bytes, not a whole number of {CIFAR_RECORD}-byte CIFAR-10 records; "
                             "download the binary version again")
        with open(f, "rb") as fh:
            first = fh.read(1)[0]
        if first > 9:
            raise ValueError(f"{f}: the first record's label is {first}, not 0..9; this is not CIFAR-10's "
                             "binary version (python and matlab versions are not read)")
        _check_labels(f, np.memmap(f, dtype=np.uint8, mode="r").reshape(-1, CIFAR_RECORD)[:, 0],
                      "download the binary version again")
        counts[name] = size // CIFAR_RECORD
    return DataInfo("cifar10", (3, 32, 32), 10, sum(counts[n] for n in CIFAR_TRAIN), counts[CIFAR_TEST])


def _check_labels(path: Path, labels: np.ndarray, fix: str) -> None:
    """Every label 0..9, else name the first record that is not (counted from 0)."""
    bad = np.flatnonzero(np.asarray(labels) > 9)
    if bad.size:
        i = int(bad[0])
        more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
        raise ValueError(f"{path}: record {i} has label {int(labels[i])}, not 0..9{more}; {fix}")


def _mnist_paths(p: Path) -> dict[str, Path] | None:
    out = {}
    for key, name in MNIST_FILES.items():
        for candidate in (p / name, p / f"{name}.gz"):
            if candidate.is_file():
                out[key] = candidate
                break
    if not out:
        return None
    missing = [MNIST_FILES[k] for k in MNIST_FILES if k not in out]
    if missing:
        raise ValueError(f"MNIST IDX files are missing: {', '.join(missing)} (or .gz); give all four")
    return out


def _idx_header(path: Path, images: bool) -> tuple[int, ...]:
    opener = gzip.open if path.suffix == ".gz" else open
    size = 16 if images else 8
    try:
        with opener(path, "rb") as fh:
            head = fh.read(size)
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); download it again") from None
    if len(head) < size:
        raise ValueError(f"{path} is too short for an IDX header; download it again")
    magic, *dims = struct.unpack(">IIII" if images else ">II", head)
    want = IMAGE_MAGIC if images else LABEL_MAGIC
    if magic != want:
        raise ValueError(f"{path}: IDX magic {magic:#010x}, expected {want:#010x} "
                         f"({'images' if images else 'labels'}); download it again")
    if path.suffix != ".gz":
        expected = size + int(np.prod(dims))
        actual = path.stat().st_size
        if actual != expected:
            raise ValueError(f"{path} is {actual} bytes, its header says {expected}; download it again")
    return tuple(dims)


def _probe_mnist(p: Path) -> DataInfo:
    paths = _mnist_paths(p)
    assert paths is not None
    counts, shape = {}, None
    for split in ("train", "test"):
        n, rows, cols = _idx_header(paths[f"{split}_x"], images=True)
        (m,) = _idx_header(paths[f"{split}_y"], images=False)
        if n != m:
            raise ValueError(f"{paths[f'{split}_x']} holds {n} images but {paths[f'{split}_y']} {m} labels; "
                             "download both again")
        if 0 in (n, rows, cols):
            raise ValueError(f"{paths[f'{split}_x']} holds {n} images of {rows}x{cols} (its header); a run "
                             "needs training and held-out images: download it again")
        _idx_array(paths[f"{split}_x"], images=True)  # a .gz read to its end and counted
        _check_labels(paths[f"{split}_y"], _idx_array(paths[f"{split}_y"], images=False),
                      "download it again")
        if shape is not None and shape != (1, rows, cols):
            raise ValueError(f"training images are {shape[1]}x{shape[2]}, test images {rows}x{cols}; "
                             "give one data set")
        shape, counts[split] = (1, rows, cols), n
    return DataInfo("mnist", shape, 10, counts["train"], counts["test"])


def _read_text(p: Path) -> str:
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); {WHAT}") from None


def _probe_text(p: Path, seq_len: int) -> DataInfo:
    text = _read_text(p)
    cut = _cut(len(text))
    if cut < seq_len + 1 or len(text) - cut < seq_len + 1:
        need = int(np.ceil((seq_len + 1) / TEXT_HELD_OUT))
        raise ValueError(f"holds {len(text)} characters; a training and a held-out sequence of --seq-len "
                         f"{seq_len} need at least {need}: give a longer text or a smaller --seq-len")
    return DataInfo("text", None, None, cut, len(text) - cut, vocab=len(set(text)))


def _cut(n: int) -> int:
    return n - int(n * TEXT_HELD_OUT)


# ---------------------------------------------------------------- reading (workers)


def load_images(path: str) -> Images:
    """The images and labels of a probed folder (`probe(path).images`)."""
    p = Path(path)
    folder = _cifar_folder(p)
    if folder is not None:
        parts = [_cifar_records(folder / n) for n in CIFAR_TRAIN]
        test = _cifar_records(folder / CIFAR_TEST)
        x = np.concatenate([r[:, 1:] for r in parts]).reshape(-1, 3, 32, 32)
        y = np.concatenate([r[:, 0] for r in parts]).astype(np.int64)
        return Images(x, y, test[:, 1:].reshape(-1, 3, 32, 32), test[:, 0].astype(np.int64), 10)
    paths = _mnist_paths(p)
    if paths is None:
        raise ValueError(f"{path}: no CIFAR-10 or MNIST files")
    arrays = {k: _idx_array(v, images=k.endswith("_x")) for k, v in paths.items()}
    for key in ("train_y", "test_y"):
        _check_labels(paths[key], arrays[key], "download it again")
    return Images(arrays["train_x"][:, None], arrays["train_y"].astype(np.int64),
                  arrays["test_x"][:, None], arrays["test_y"].astype(np.int64), 10)


def _cifar_records(f: Path) -> np.ndarray:
    records = np.memmap(f, dtype=np.uint8, mode="r").reshape(-1, CIFAR_RECORD)
    _check_labels(f, records[:, 0], "download the binary version again")
    return records


def _idx_array(path: Path, images: bool) -> np.ndarray:
    """The values of an IDX file, shaped as its header says (a .gz decompressed to its end and
    its values counted; an uncompressed file's length is checked against its header)."""
    dims = _idx_header(path, images)
    offset = 16 if images else 8
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{path} cannot be decompressed to its end ({exc}); download it again") from None
        data = np.frombuffer(raw, dtype=np.uint8, offset=offset)
        if data.size != int(np.prod(dims)):
            raise ValueError(f"{path} holds {data.size} values, its header says {int(np.prod(dims))}; "
                             "download it again")
    else:
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset)
    return data.reshape(dims)


def load_text(path: str) -> Text:
    """The characters of a text file as ids (sorted characters), split training / held-out."""
    text = _read_text(Path(path))
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    cut = _cut(len(text))
    return Text(ids[:cut], ids[cut:], chars)

