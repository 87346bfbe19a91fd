"""prepare-data: one JPEG folder dataset -> MXNet RecordIO, TFRecord shards and a JPEG file list.

Every format holds the same re-encoded JPEG bytes, written in pure Python (no framework import):
RecordIO as MXNet's im2rec writes it, TFRecord with a hand-encoded tf.train.Example.

Errors: a bad --src layout or option fails before anything is written; files that do not
decode are skipped, everything good is written, and the command then fails naming each one.
"""

from __future__ import annotations

import csv
import io
import json
import struct
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from bench import __version__
from bench.data.checks import MAX_QUALITY, integer_in, new_folder
from bench.errors import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg")
LAYOUT_HINT = "a folder with one sub-folder of JPEGs per class"

# --- CRC32C (Castagnoli) and TFRecord framing -----------------------------------------------

_CRC32C_POLY = 0x82F63B78  # reflected 0x1EDC6F41


def _crc32c_table() -> list[int]:
    """The 256-entry lookup table of the reflected Castagnoli polynomial."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of data (continuing from crc), table-driven, one byte at a time."""
    table = _CRC32C_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C: rotate right by 15 and add a constant, mod 2**32."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(data: bytes) -> bytes:
    """One TFRecord: uint64 length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data
            + struct.pack("<I", masked_crc(data)))


def read_tfrecords(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file, checking both CRCs (for tests and sanity checks)."""
    raw = Path(path).read_bytes()
    pos = 0
    while pos < len(raw):
        length_bytes = raw[pos:pos + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (len_crc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        if len_crc != masked_crc(length_bytes):
            raise ValueError(f"{path}: bad length CRC at offset {pos}")
        data = raw[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
        if data_crc != masked_crc(data):
            raise ValueError(f"{path}: bad data CRC at offset {pos}")
        yield data
        pos += 16 + length


# --- tf.train.Example protobuf encoding ------------------------------------------------------


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 as its 64-bit two's complement (10 bytes)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): tag, length, payload."""
    return varint((field << 3) | 2) + varint(len(payload)) + payload


def bytes_feature(values: Iterable[bytes]) -> bytes:
    """Feature{bytes_list (1): BytesList{repeated bytes value = 1}}."""
    return _len_field(1, b"".join(_len_field(1, v) for v in values))


def int64_feature(values: Iterable[int]) -> bytes:
    """Feature{int64_list (3): Int64List{repeated int64 value = 1 [packed]}}."""
    return _len_field(3, _len_field(1, b"".join(varint(v) for v in values)))


def encode_example(features: dict[str, bytes]) -> bytes:
    """Example{features = 1: Features{map<string, Feature> feature = 1}} from encoded Features.

    Map entries are repeated messages {key = 1, value = 2}; sorted keys keep bytes stable."""
    entries = b"".join(_len_field(1, _len_field(1, key.encode()) + _len_field(2, value))
                       for key, value in sorted(features.items()))
    return _len_field(1, entries)


def image_example(jpeg: bytes, label: int, height: int, width: int) -> bytes:
    """The serialized tf.train.Example of one image (the ImageNet/TF-slim feature names)."""
    return encode_example({
        "image/encoded": bytes_feature([jpeg]),
        "image/class/label": int64_feature([label]),
        "image/height": int64_feature([height]),
        "image/width": int64_feature([width]),
    })


# --- MXNet RecordIO ---------------------------------------------------------------------------

RECORDIO_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", RECORDIO_MAGIC)
IRHEADER = "IfQQ"


def irheader(label: float, image_id: int, flag: int = 0, id2: int = 0) -> bytes:
    """mx.recordio.IRHeader packed as MXNet packs it: flag, label, id, id2."""
    return struct.pack(IRHEADER, flag, label, image_id, id2)


def _lrecord(cflag: int, length: int) -> bytes:
    return struct.pack("<I", (cflag << 29) | length)


def recordio_frame(payload: bytes) -> bytes:
    """One record framed as dmlc's RecordIOWriter does: magic, lrecord, data, pad to 4 bytes.

    A magic number at a 4-byte-aligned offset of the payload is cut out and the record split
    into parts (cflag 1 first, 2 middle, 3 last), so a reader can always resync on the magic."""
    length = len(payload)
    if length >= 1 << 29:
        raise ValueError(f"a RecordIO record must be under 512 MiB; got {length} bytes")
    out = bytearray()
    start = 0
    for i in range(0, length - length % 4, 4):
        if payload[i:i + 4] == _MAGIC_BYTES:
            out += _MAGIC_BYTES + _lrecord(1 if start == 0 else 2, i - start) + payload[start:i]
            start = i + 4
    out += _MAGIC_BYTES + _lrecord(3 if start else 0, length - start) + payload[start:]
    out += b"\0" * (-length % 4)
    return bytes(out)


def read_recordio(data: bytes, offset: int = 0) -> tuple[bytes, int]:
    """The record at offset of a RecordIO byte string (parts re-joined) and the next offset."""
    parts: list[bytes] = []
    pos = offset
    while True:
        magic, lrec = struct.unpack("<II", data[pos:pos + 8])
        if magic != RECORDIO_MAGIC:
            raise ValueError(f"no RecordIO magic at offset {pos}")
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        parts.append(data[pos + 8:pos + 8 + length])
        pos += 8 + length + (-length % 4)
        if cflag in (0, 3):
            return _MAGIC_BYTES.join(parts), pos


def unpack_record(record: bytes) -> tuple[tuple[int, float, int, int], bytes]:
    """(flag, label, id, id2) and the image bytes of an im2rec record with one label."""
    size = struct.calcsize(IRHEADER)
    flag, label, image_id, id2 = struct.unpack(IRHEADER, record[:size])
    return (flag, label, image_id, id2), record[size:]


# --- the dataset -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One source image: its label and where it is."""

    label: int
    src: Path
    rel: str  # <class>/<file>, the same under --src and --out/jpeg


@dataclass(frozen=True)
class Encoded:
    """One image after decode/resize/encode: what every format needs, built in a worker."""

    rel: str
    label: int
    jpeg: bytes
    height: int
    width: int
    tfrecord: bytes
    error: str = ""


MAX_RESIZE = 16384  # pixels of the shorter side (an int past C's long broke Pillow)
MAX_WORKERS = 1024  # decode processes (an int past C's int broke the pool)


def validate_options(src: Path, out: Path, resize: int, quality: int, shards: int,
                     workers: int) -> None:
    """ConfigError (one line: option, value, what is allowed) for bad options."""
    if not 0 <= resize <= MAX_RESIZE:
        raise ConfigError(f"--resize: {resize} is not allowed; allowed: 0 (keep the size) or "
                          f"an integer from 1 to {MAX_RESIZE} (the shorter side)")
    integer_in("--quality", quality, 1, MAX_QUALITY)
    if shards < 1:
        raise ConfigError(f"--shards: {shards} is not allowed; allowed: an integer >= 1")
    integer_in("--workers", workers, 1, MAX_WORKERS)
    new_folder(out)
    if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        raise ConfigError(f"--out: {str(out)!r} is inside --src; allowed: a folder outside it")


def scan(src: Path) -> tuple[list[str], list[Item]]:
    """Sorted class folder names and every image, ordered by class then file name."""
    if not src.is_dir():
        what = "does not exist" if not src.exists() else "is not a folder"
        raise ConfigError(f"--src: {str(src)!r} {what}; allowed: {LAYOUT_HINT}")
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ConfigError(f"--src: {str(src)!r} is an empty folder (no class sub-folders); "
                          f"allowed: {LAYOUT_HINT}")
    items: list[Item] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (src / name).iterdir()
                       if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            empty.append(str(src / name))
        items += [Item(label, p, f"{name}/{p.name}") for p in files]
    if empty:
        listed = ", ".join(repr(e) for e in empty)
        raise ConfigError(f"--src: class folder{'s' if len(empty) > 1 else ''} {listed} "
                          f"ha{'ve' if len(empty) > 1 else 's'} no images "
                          f"({'/'.join(IMAGE_SUFFIXES)}); allowed: {LAYOUT_HINT}, none empty")
    return classes, items


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """(width, height) with the shorter side at `shorter` and the aspect kept (0: unchanged)."""
    if shorter == 0:
        return width, height
    if width <= height:
        return shorter, max(1, round(height * shorter / width))
    return max(1, round(width * shorter / height)), shorter


def encode_item(item: Item, resize: int, quality: int) -> Encoded:
    """Decode, convert to RGB, resize, re-encode; a file that does not decode gives .error."""
    try:
        with Image.open(item.src) as img:
            img.load()
            rgb = img.convert("RGB")
    except Exception as exc:  # any decoder failure means "not an image"
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # the error stays one line
        return Encoded(item.rel, item.label, b"", 0, 0, b"", reason)
    size = resized_size(rgb.width, rgb.height, resize)
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG", quality=quality)
    jpeg = buf.getvalue()
    # The CRC is the slow part in pure Python, so it runs here, in the worker.
    framed = tfrecord_frame(image_example(jpeg, item.label, rgb.height, rgb.width))
    return Encoded(item.rel, item.label, jpeg, rgb.height, rgb.width, framed)


def _encode_star(args: tuple[Item, int, int]) -> Encoded:
    return encode_item(*args)


def encoded_stream(items: list[Item], resize: int, quality: int,
                   workers: int) -> Iterator[Encoded]:
    """encode_item over items, in order; a process pool when workers > 1."""
    jobs = ((item, resize, quality) for item in items)
    if workers == 1:
        yield from map(_encode_star, jobs)
        return
    window = 64 * workers  # bounds how many encoded images wait in memory
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(items), window):
            batch = [(item, resize, quality) for item in items[start:start + window]]
            yield from pool.map(_encode_star, batch, chunksize=8)


def shard_name(i: int, shards: int) -> str:
    """train-00000-of-00004, TF's ImageNet shard naming."""
    return f"train-{i:05d}-of-{shards:05d}"


@dataclass
class Tally:
    """What prepare_data wrote so far: images per class and per shard, the bad files, bytes."""

    counts: dict[str, int]
    shard_counts: list[int]
    bad: list[tuple[str, str]] = field(default_factory=list)
    total_bytes: int = 0
    written: int = 0


@dataclass
class Sinks:
    """The open files one image goes to: RecordIO (.rec, .idx, .lst), files.csv, the shards."""

    rec: Any
    idx: Any
    lst: Any
    files_csv: Any
    shards: list[Any]


def prepare_data(src: Path, out: Path, resize: int = 256, quality: int = 95, shards: int = 4,
                 workers: int = 2, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write every format and manifest.json into out; returns the manifest.

    Raises ConfigError before writing for a bad layout or option, and after writing
    everything good when some files are not decodable images (they are named)."""
    src, out = Path(src), Path(out)
    validate_options(src, out, resize, quality, shards, workers)
    classes, items = scan(src)
    if shards > len(items):
        raise ConfigError(f"--shards: {shards} is not allowed; allowed: 1 to the number of "
                          f"images ({len(items)}), so no shard is empty")
    out.mkdir(parents=True, exist_ok=True)
    (out / "tfrecord").mkdir()
    for name in classes:
        (out / "jpeg" / name).mkdir(parents=True)
    names = [shard_name(i, shards) for i in range(shards)]
    tally = Tally(dict.fromkeys(classes, 0), [0] * shards)
    step = max(1, len(items) // 10)
    shard_files = [(out / "tfrecord" / n).open("wb") for n in names]
    try:
        with (out / "train.rec").open("wb") as rec, (out / "train.idx").open("w") as idx, \
                (out / "train.lst").open("w") as lst, \
                (out / "files.csv").open("w", newline="") as csv_file:
            sinks = Sinks(rec, idx, lst, csv.writer(csv_file), shard_files)
            for done, enc in enumerate(encoded_stream(items, resize, quality, workers), 1):
                if enc.error:
                    tally.bad.append((str(src / enc.rel), enc.error))
                else:
                    _write_image(enc, out, sinks, classes, tally)
                if log and (done % step == 0 or done == len(items)):
                    log(f"  {done}/{len(items)} images ({tally.total_bytes:,} JPEG bytes"
                        f"{f', {len(tally.bad)} bad' if tally.bad else ''})")
    finally:
        for f in shard_files:
            f.close()
    (out / "classes.json").write_text(
        json.dumps({str(k): name for k, name in enumerate(classes)}, indent=2) + "\n")
    options = {"resize": resize, "quality": quality, "shards": shards, "workers": workers}
    manifest = _manifest(src, classes, tally, names, options)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if tally.bad:
        bad = tally.bad
        listed = ", ".join(f"{p!r} ({e})" for p, e in bad)
        raise ConfigError(f"--src: {len(bad)} file{'s are' if len(bad) > 1 else ' is'} not a "
                          f"decodable image: {listed}; the other {tally.written} images were "
                          f"written to {str(out)!r}; allowed: JPEG files only")
    return manifest


def _write_image(enc: Encoded, out: Path, sinks: Sinks, classes: list[str],
                 tally: Tally) -> None:
    """One good image into every format: its JPEG file, a RecordIO record with its .idx and
    .lst lines, a TFRecord in shard id mod shards, a files.csv row."""
    image_id, shards = tally.written, len(sinks.shards)
    (out / "jpeg" / enc.rel).write_bytes(enc.jpeg)
    sinks.idx.write(f"{image_id}\t{sinks.rec.tell()}\n")
    sinks.rec.write(recordio_frame(irheader(float(enc.label), image_id) + enc.jpeg))
    # im2rec's list format: index, label(s) as %f, path under the image root.
    sinks.lst.write(f"{image_id}\t{float(enc.label):f}\t{enc.rel}\n")
    sinks.shards[image_id % shards].write(enc.tfrecord)
    tally.shard_counts[image_id % shards] += 1
    sinks.files_csv.writerow([f"jpeg/{enc.rel}", enc.label])
    tally.counts[classes[enc.label]] += 1
    tally.total_bytes += len(enc.jpeg)
    tally.written += 1


def _manifest(src: Path, classes: list[str], tally: Tally, names: list[str],
              options: dict[str, int]) -> dict[str, Any]:
    """manifest.json: what was written, in which formats, with which options."""
    return {
        "tool": "mgbench prepare-data",
        "version": __version__,
        "src": str(src),
        "images": tally.written,
        "classes": len(classes),
        "counts": tally.counts,
        "options": options,
        "total_jpeg_bytes": tally.total_bytes,
        "formats": {
            "jpeg": {"layout": "jpeg/<class>/<image>", "list": "files.csv",
                     "list_format": "path relative to this folder,label (no header)"},
            "recordio": {"rec": "train.rec", "idx": "train.idx", "lst": "train.lst",
                         "lst_root": "jpeg", "header": "IRHeader(flag=0, label, id, id2=0)"},
            "tfrecord": {"shards": {f"tfrecord/{n}": c for n, c in zip(names, tally.shard_counts,
                                                                          strict=True)},
                         "features": ["image/encoded", "image/class/label", "image/height",
                                      "image/width"]},
        },
        "classes_file": "classes.json",
        "bad_files": [{"path": p, "error": e} for p, e in tally.bad],
    }
