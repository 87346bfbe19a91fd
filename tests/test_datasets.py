"""make-dataset: real JPEGs in ImageNet folder style, reproducible from a seed; bad input is
one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from bench.data.datasets import make_dataset, per_class_counts
from bench.plan.config import ConfigError
from tests.helpers.cli import run_cli


def jpegs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.jpg"))


def test_layout_files_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    manifest = make_dataset(out, classes=3, images=12, size=32)
    assert sorted(p.name for p in out.iterdir()) == [
        "class_000", "class_001", "class_002", "manifest.json"]
    files = jpegs(out)
    assert len(files) == 12
    for name in ("class_000", "class_001", "class_002"):
        assert len(list((out / name).glob("*.jpg"))) == 4
    for path in files:
        with Image.open(path) as img:
            assert img.format == "JPEG" and img.mode == "RGB" and img.size == (32, 32)
            img.load()
    contents = [p.read_bytes() for p in files]
    assert len(set(contents)) == 12
    assert len({len(c) for c in contents}) > 1, "file sizes should differ"
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["classes"] == ["class_000", "class_001", "class_002"]
    assert manifest["counts"] == {"class_000": 4, "class_001": 4, "class_002": 4}
    assert (manifest["images"], manifest["size"], manifest["seed"], manifest["quality"]) == (
        12, 32, 0, 90)
    assert manifest["version"]
    assert manifest["total_bytes"] == sum(len(c) for c in contents)


def test_uneven_split_gives_extra_images_to_first_classes() -> None:
    assert per_class_counts(3, 10) == [4, 3, 3]
    assert sum(per_class_counts(7, 100)) == 100


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    make_dataset(a, 2, 4, 24, seed=5)
    make_dataset(b, 2, 4, 24, seed=5)
    make_dataset(c, 2, 4, 24, seed=6)
    rel = [p.relative_to(a) for p in jpegs(a)]
    assert rel == [p.relative_to(b) for p in jpegs(b)] == [p.relative_to(c) for p in jpegs(c)]
    assert all((a / r).read_bytes() == (b / r).read_bytes() for r in rel)
    assert all((a / r).read_bytes() != (c / r).read_bytes() for r in rel)


def test_empty_existing_folder_is_fine(tmp_path: Path) -> None:
    manifest = make_dataset(tmp_path, 1, 1, 8, quality=1)
    assert manifest["counts"] == {"class_000": 1}


def test_cli_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    proc = run_cli("make-dataset", "--out", str(out), "--classes", "2", "--images", "6",
                   "--size", "16", "--seed", "3", "--quality", "80", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6/6 images" in proc.stdout
    assert f"dataset: {out}" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"{manifest['total_bytes']:,} bytes" in proc.stdout
    assert (manifest["seed"], manifest["quality"], manifest["size"]) == (3, 80, 16)
    assert len(jpegs(out)) == 6


@pytest.mark.parametrize("option, value", [
    ("--classes", "0"), ("--images", "2"), ("--size", "7"), ("--size", "4097"),
    ("--quality", "0"), ("--quality", "96"), ("--out", "NONEMPTY")])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, option: str, value: str) -> None:
    nonempty = tmp_path / "full"
    nonempty.mkdir()
    (nonempty / "x.txt").write_text("x")
    args = {"--out": str(tmp_path / "new"), "--classes": "3", "--images": "12", "--size": "16",
            "--quality": "90"}
    args[option] = str(nonempty) if value == "NONEMPTY" else value
    proc = run_cli("make-dataset", *[s for kv in args.items() for s in kv], timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}:"), proc.stderr
    assert "allowed" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "new").exists()


def test_bad_input_raises_config_error_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--images"):
        make_dataset(tmp_path / "ds", classes=4, images=3, size=16)
    assert not (tmp_path / "ds").exists()
