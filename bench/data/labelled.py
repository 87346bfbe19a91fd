"""make-dataset --source digits | cifar10: a labelled dataset with a fixed training and held-out
split, for mode converge (time to accuracy), in the harness's real-data format.

The folder is a prepare-data folder of the training split (JPEG list, RecordIO, TFRecord: what
benchmark runs with data real read) plus `splits.npz`: the pixels of both splits as uint8
(N, 32, 32, 3) with int64 labels (x_train, y_train, x_heldout, y_heldout), which mode converge
trains and evaluates on (runners/converge.py), as seed 004 trained on CIFAR-10's arrays. Its
manifest.json says which source, the split and the sizes.

- digits: scikit-learn's bundled handwritten digits (1,797 8x8 greyscale images of 0-16, 10
  classes; no download), scaled to 0-255, upscaled to 32x32 (bilinear) and repeated over RGB;
  the split fixed by a seeded permutation: 1,437 training, 360 held out (20%).
- cifar10: a CIFAR-10 archive the user already has, "CIFAR-10 python version" from its site
  (cifar-10-python.tar.gz, or the folder cifar-10-batches-py it unpacks to): data_batch_1..5
  are the training split (50,000), test_batch the held-out one (10,000), as published. Its
  batches are Python pickles: read only a file you trust (the site's).

Imports numpy, Pillow and (digits) scikit-learn; no framework.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

SOURCES = ("synthetic", "digits", "cifar10")
SPLITS_FILE = "splits.npz"
SIZE = 32
DIGITS_HELDOUT = 360
DIGITS_SEED = 0
CIFAR_MEMBERS = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
FROM_MAX_BYTES = 2**30  # the CIFAR-10 python archive is 163 MiB, each batch 30 MiB


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a folder that is not empty" if out.is_dir() else "an existing file"
        raise ConfigError(f"--out: {str(out)!r} is {what}; allowed: a new or empty folder")


def digits_arrays() -> tuple[dict[str, np.ndarray], list[str]]:
    """scikit-learn's digits as the split's arrays (32x32 RGB uint8) and class names."""
    import numpy as np
    from PIL import Image

    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ConfigError("--source: digits needs scikit-learn in the harness's environment "
                          f"({exc}); allowed after `pip install -r requirements.txt`") from None
    digits = load_digits()
    grey = np.clip(digits.images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    up = np.stack([np.asarray(Image.fromarray(g).resize((SIZE, SIZE), Image.BILINEAR))
                   for g in grey])
    rgb = np.repeat(up[..., None], 3, axis=3)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(DIGITS_SEED).permutation(len(labels))
    held, train = order[:DIGITS_HELDOUT], order[DIGITS_HELDOUT:]
    arrays = {"x_train": rgb[train], "y_train": labels[train], "x_heldout": rgb[held],
              "y_heldout": labels[held]}
    return arrays, [str(k) for k in range(10)]


def _unpickle(raw: bytes, name: str) -> dict[Any, Any]:
    try:
        data = pickle.loads(raw, encoding="bytes")  # noqa: S301 (the user's own CIFAR file)
    except Exception as exc:  # a damaged archive: one line, not a traceback
        raise ConfigError(f"--from: {name} is not a CIFAR-10 python batch ({exc}); allowed: "
                          "the 'CIFAR-10 python version' archive") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--from: {name} holds {type(data).__name__}, not a CIFAR-10 batch; "
                          "allowed: the 'CIFAR-10 python version' archive")
    return data


def _bounded_size(path: Path, st: os.stat_result) -> None:
    """Refuse what make-dataset must not read: no regular file (a FIFO would block, /dev/zero
    never end) or one past FROM_MAX_BYTES; stat only, nothing opened."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"--from: {str(path)!r} is not a regular file; allowed: "
                          "cifar-10-python.tar.gz or the folder cifar-10-batches-py")
    if st.st_size > FROM_MAX_BYTES:
        raise ConfigError(f"--from: {str(path)!r} is {st.st_size:,} bytes, past "
                          f"{FROM_MAX_BYTES:,}; allowed: cifar-10-python.tar.gz (163 MiB)")


def _cifar_members(path: Path) -> dict[str, bytes]:
    """The batches of a cifar-10-python.tar.gz or of its unpacked cifar-10-batches-py."""
    found: dict[str, bytes] = {}
    if path.is_dir():
        for name in CIFAR_MEMBERS:
            if (path / name).exists():
                _bounded_size(path / name, (path / name).stat())
                found[name] = (path / name).read_bytes()
        return _all_members(path, found)
    _bounded_size(path, path.stat())
    try:
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                name = member.name.rsplit("/", 1)[-1]
                if member.isfile() and name in CIFAR_MEMBERS and member.size <= FROM_MAX_BYTES:
                    fh = tar.extractfile(member)
                    if fh is not None:
                        found[name] = fh.read()
    except (OSError, tarfile.TarError) as exc:
        raise ConfigError(f"--from: {str(path)!r} is not a readable tar archive ({exc}); "
                          "allowed: cifar-10-python.tar.gz or the folder "
                          "cifar-10-batches-py") from None
    return _all_members(path, found)


def _all_members(path: Path, found: dict[str, bytes]) -> dict[str, bytes]:
    missing = [n for n in CIFAR_MEMBERS if n not in found]
    if missing:
        raise ConfigError(f"--from: {str(path)!r} lacks {', '.join(missing)}; allowed: "
                          "cifar-10-python.tar.gz (the python version) or its folder "
                          "cifar-10-batches-py")
    return found


def _cifar_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    data = _unpickle(raw, name)
    try:
        x = np.asarray(data[b"data"], dtype=np.uint8).reshape(-1, 3, SIZE, SIZE)
        y = np.asarray(data[b"labels"], dtype=np.int64)
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"--from: {name} has no 3,072-byte images and labels ({exc}); "
                          "allowed: the 'CIFAR-10 python version' archive") from None
    if len(x) != len(y):
        raise ConfigError(f"--from: {name} has {len(x)} images and {len(y)} labels; allowed: "
                          "the 'CIFAR-10 python version' archive")
    return x.transpose(0, 2, 3, 1), y


def cifar10_arrays(path: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """CIFAR-10's published split as arrays (N, 32, 32, 3) and its class names."""
    import numpy as np

    if not path.exists():
        raise ConfigError(f"--from: {str(path)!r} does not exist; allowed: "
                          "cifar-10-python.tar.gz or the folder cifar-10-batches-py")
    members = _cifar_members(path)
    parts = [_cifar_batch(members[f"data_batch_{i}"], f"data_batch_{i}") for i in range(1, 6)]
    x_test, y_test = _cifar_batch(members["test_batch"], "test_batch")
    meta = _unpickle(members["batches.meta"], "batches.meta")
    names = [n.decode() if isinstance(n, bytes) else str(n)
             for n in meta.get(b"label_names", [])] or [str(k) for k in range(10)]
    arrays = {"x_train": np.concatenate([p[0] for p in parts]),
              "y_train": np.concatenate([p[1] for p in parts]),
              "x_heldout": x_test, "y_heldout": y_test}
    top = max(int(arrays["y_train"].max()), int(arrays["y_heldout"].max()))
    if min(int(arrays["y_train"].min()), int(arrays["y_heldout"].min())) < 0 or top >= len(names):
        raise ConfigError(f"--from: labels run to {top}, beyond the {len(names)} class names; "
                          "allowed: the 'CIFAR-10 python version' archive")
    return arrays, names


def write_labelled(out: Path, source: str, from_file: str | None = None, workers: int = 2,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write source's splits into out (a prepare-data folder of the training split, plus
    splits.npz); returns the manifest."""
    import numpy as np
    from PIL import Image

    from bench.data.prepare import prepare_data

    out = Path(out)
    check_out(out)
    if source == "digits":
        if from_file:
            raise ConfigError(f"--from: {from_file!r} is not allowed with --source digits "
                              "(scikit-learn bundles them); allowed: nothing")
        arrays, names = digits_arrays()
        origin = "scikit-learn load_digits (bundled), upscaled 8x8 -> 32x32 bilinear, RGB"
        split = (f"a seeded permutation (seed {DIGITS_SEED}): its first {DIGITS_HELDOUT} held "
                 "out")
    elif source == "cifar10":
        if not from_file:
            raise ConfigError("--from: missing; required with --source cifar10 (the CIFAR-10 "
                              "python version archive you have; nothing here downloads)")
        arrays, names = cifar10_arrays(Path(from_file))
        origin = f"CIFAR-10 python version: {Path(from_file).resolve()}"
        split = "as published: data_batch_1..5 train, test_batch held out"
    else:
        raise ConfigError(f"--source: {source!r} is not allowed here; allowed: digits, cifar10")
    if log:
        log(f"  {len(arrays['y_train'])} training and {len(arrays['y_heldout'])} held-out "
            f"images, {len(names)} classes")
    with tempfile.TemporaryDirectory(prefix="mgbench-labelled-") as tmp:
        src = Path(tmp)
        width = max(3, len(str(len(names) - 1)))
        folders = [f"class_{k:0{width}d}" for k in range(len(names))]
        for folder in folders:
            (src / folder).mkdir()
        for i, (img, label) in enumerate(zip(arrays["x_train"], arrays["y_train"],
                                             strict=True)):
            Image.fromarray(img).save(src / folders[label] / f"{i:06d}.jpg", format="JPEG",
                                      quality=95)
        manifest = prepare_data(src, out, resize=0, quality=95,
                                shards=min(4, len(arrays["y_train"])), workers=workers, log=log)
    np.savez(out / SPLITS_FILE, **arrays)
    manifest.update({
        "src": origin, "source": source, "origin": origin, "class_names": names,
        "splits": {"file": SPLITS_FILE, "train": int(len(arrays["y_train"])),
                   "heldout": int(len(arrays["y_heldout"])), "how": split,
                   "arrays": "x_* uint8 (N, 32, 32, 3) RGB, y_* int64",
                   "formats": "the JPEG list, RecordIO and TFRecord hold the training split"},
    })
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
