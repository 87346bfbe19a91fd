"""prepare-data: RecordIO, TFRecord and a JPEG list from one folder, the same bytes in each;
read back in pure Python here and through TensorFlow and MXNet in their own environments."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import struct
from pathlib import Path

import pytest
from PIL import Image

from bench.data.datasets import make_dataset
from bench.data.prepare import (
    crc32c,
    image_example,
    masked_crc,
    read_recordio,
    read_tfrecords,
    recordio_frame,
    resized_size,
    tfrecord_frame,
    unpack_record,
)
from tests.helpers.cli import run_child, run_cli

SHARDS = [f"train-{i:05d}-of-00004" for i in range(4)]


def make_src(tmp_path: Path) -> Path:
    """3 classes, 12 images 40 x 40, plus one 60 x 40 image so the aspect is checked too."""
    src = tmp_path / "src"
    make_dataset(src, classes=3, images=12, size=40)
    Image.new("RGB", (60, 40), (10, 200, 30)).save(src / "class_001" / "wide.jpg")
    return src


def prepare(src: Path, out: Path, *extra: str):
    return run_cli("prepare-data", "--src", str(src), "--out", str(out), "--resize", "32",
                   "--workers", "2", *extra, timeout=300)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("prep")
    src = make_src(tmp)
    proc = prepare(src, tmp / "out")
    assert proc.returncode == 0, proc.stderr
    assert "13/13 images" in proc.stdout
    return tmp / "out"


def expected(out: Path) -> list[list]:
    """[label, height, width, md5] of every JPEG that files.csv lists, read with Pillow."""
    rows = []
    with (out / "files.csv").open(newline="") as f:
        for path, label in csv.reader(f):
            data = (out / path).read_bytes()
            with Image.open(io.BytesIO(data)) as img:
                rows.append([int(label), img.height, img.width, hashlib.md5(data).hexdigest()])
    return rows


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283


def test_tfrecord_frame_layout() -> None:
    framed = tfrecord_frame(b"abc")
    assert framed[:8] == struct.pack("<Q", 3)
    assert framed[8:12] == struct.pack("<I", masked_crc(framed[:8]))
    assert framed[12:15] == b"abc"
    assert framed[15:] == struct.pack("<I", masked_crc(b"abc"))


def test_example_encoding_known_bytes() -> None:
    ex = image_example(b"J", label=2, height=3, width=300)
    # Features map sorted: image/class/label, image/encoded, image/height, image/width.
    assert ex.startswith(b"\x0a")
    assert b"\x0a\x11image/class/label\x12\x05\x1a\x03\x0a\x01\x02" in ex
    assert b"\x12\x05\x0a\x03\x0a\x01J" in ex
    assert b"\x12\x05\x1a\x03\x0a\x01\x03" in ex
    assert b"\x12\x06\x1a\x04\x0a\x02\xac\x02" in ex


def test_recordio_frame_pads_and_splits_on_magic() -> None:
    assert recordio_frame(b"abcde") == (struct.pack("<II", 0xCED7230A, 5) + b"abcde\0\0\0")
    magic = struct.pack("<I", 0xCED7230A)
    payload = b"abcd" + magic + b"efgh" + magic + b"xy"
    framed = recordio_frame(payload)
    assert struct.unpack("<I", framed[4:8])[0] >> 29 == 1
    assert len(framed) % 4 == 0
    assert read_recordio(framed) == (payload, len(framed))


def test_resized_size_keeps_aspect() -> None:
    assert resized_size(40, 40, 32) == (32, 32)
    assert resized_size(60, 40, 32) == (48, 32)
    assert resized_size(40, 80, 20) == (20, 40)
    assert resized_size(61, 17, 0) == (61, 17)


def test_writes_every_file(prepared: Path) -> None:
    for name in ("train.lst", "train.rec", "train.idx", "files.csv", "classes.json",
                 "manifest.json"):
        assert (prepared / name).stat().st_size > 0, name
    assert sorted(p.name for p in (prepared / "tfrecord").iterdir()) == SHARDS
    assert len(list((prepared / "jpeg").glob("*/*.jpg"))) == 13
    assert json.loads((prepared / "classes.json").read_text()) == {
        "0": "class_000", "1": "class_001", "2": "class_002"}
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["images"] == 13 and manifest["classes"] == 3
    assert manifest["counts"] == {"class_000": 4, "class_001": 5, "class_002": 4}
    assert manifest["options"] == {"resize": 32, "quality": 95, "shards": 4, "workers": 2}
    assert set(manifest["formats"]) == {"jpeg", "recordio", "tfrecord"}
    assert sum(manifest["formats"]["tfrecord"]["shards"].values()) == 13
    assert manifest["bad_files"] == []


def test_lst_idx_rec_agree(prepared: Path) -> None:
    lst = [line.split("\t") for line in (prepared / "train.lst").read_text().splitlines()]
    idx = [line.split("\t") for line in (prepared / "train.idx").read_text().splitlines()]
    rec = (prepared / "train.rec").read_bytes()
    assert [i for i, *_ in lst] == [i for i, _ in idx] == [str(n) for n in range(13)]
    offset = 0
    for (image_id, label, rel), (_, pos) in zip(lst, idx, strict=True):
        assert int(pos) == offset
        record, offset = read_recordio(rec, offset)
        (flag, rec_label, rec_id, id2), jpeg = unpack_record(record)
        assert (flag, rec_id, id2) == (0, int(image_id), 0)
        assert rec_label == float(label) == float(rel.split("/")[0][-3:])
        assert jpeg == (prepared / "jpeg" / rel).read_bytes()
        with Image.open(io.BytesIO(jpeg)) as img:
            img.load()
            assert min(img.size) == 32
            assert img.size == ((48, 32) if rel.endswith("wide.jpg") else (32, 32))
    assert offset == len(rec)


def test_files_csv_lists_every_image(prepared: Path) -> None:
    rows = expected(prepared)
    assert len(rows) == 13
    assert sorted(r[0] for r in rows) == [0] * 4 + [1] * 5 + [2] * 4
    on_disk = {f"jpeg/{p.parent.name}/{p.name}" for p in (prepared / "jpeg").glob("*/*.jpg")}
    with (prepared / "files.csv").open(newline="") as f:
        assert {path for path, _ in csv.reader(f)} == on_disk


def test_tfrecords_parse_in_pure_python(prepared: Path) -> None:
    records = [r for s in SHARDS for r in read_tfrecords(prepared / "tfrecord" / s)]
    assert len(records) == 13
    jpegs = {(prepared / "jpeg" / rel).read_bytes()
             for rel in [p.relative_to(prepared / "jpeg") for p in
                         (prepared / "jpeg").glob("*/*.jpg")]}
    assert all(any(j in r for j in jpegs) for r in records)


def test_resize_0_keeps_size(tmp_path: Path) -> None:
    src = make_src(tmp_path)
    proc = run_cli("prepare-data", "--src", str(src), "--out", str(tmp_path / "out"),
                   "--resize", "0", "--shards", "1", "--workers", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    sizes = {r[1:3] == [40, 40] or r[1:3] == [40, 60] for r in expected(tmp_path / "out")}
    assert sizes == {True}


def one_line_error(proc, *names: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for name in names:
        assert name in lines[0]
    return lines[0]


def test_missing_and_empty_src_fail_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_line_error(prepare(tmp_path / "nope", out), "--src", "nope", "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(prepare(empty, out), "--src", "empty folder")
    assert not out.exists()


def test_empty_class_folder_is_named(tmp_path: Path) -> None:
    src = make_src(tmp_path)
    (src / "class_zzz").mkdir()
    (src / "class_zzz" / "notes.txt").write_text("no images here")
    out = tmp_path / "out"
    one_line_error(prepare(src, out), "class_zzz", "no images")
    assert not out.exists()


def test_non_image_is_named_and_the_good_ones_are_written(tmp_path: Path) -> None:
    src = make_src(tmp_path)
    (src / "class_002" / "broken.jpg").write_text("this is not a JPEG")
    (src / "class_000" / "also_bad.jpeg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    out = tmp_path / "out"
    line = one_line_error(prepare(src, out), "broken.jpg", "also_bad.jpeg",
                          "not a decodable image")
    assert "other 13 images were written" in line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"] == 13 and len(manifest["bad_files"]) == 2
    assert len((out / "train.lst").read_text().splitlines()) == 13
    assert len(expected(out)) == 13


@pytest.mark.parametrize("option, value", [
    ("--resize", "-1"), ("--quality", "0"), ("--quality", "96"), ("--shards", "0"),
    ("--shards", "99"), ("--workers", "0"), ("--out", "NONEMPTY")])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, option: str, value: str) -> None:
    src = make_src(tmp_path)
    out = tmp_path / "out"
    if value == "NONEMPTY":
        out.mkdir()
        (out / "x.txt").write_text("x")
        proc = prepare(src, out)
    else:
        proc = prepare(src, out, option, value)
    assert one_line_error(proc, option).startswith(f"error: {option}:")
    assert not (out / "manifest.json").exists()


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_tfrecord_round_trip_in_tensorflow(prepared: Path, tf_python: str) -> None:
    result = run_child(tf_python, "tests/children/prepared_tfrecords.py", str(prepared))
    assert result["files"] == 4
    assert sorted(result["rows"]) == sorted(expected(prepared))


@pytest.mark.slow
@pytest.mark.framework("mxnet")
def test_recordio_round_trip_in_mxnet(prepared: Path, mxnet_python: str) -> None:
    result = run_child(mxnet_python, "tests/children/prepared_recordio.py", str(prepared))
    # .rec ids follow files.csv order, so the rows match one for one.
    assert result["rows"] == expected(prepared)
