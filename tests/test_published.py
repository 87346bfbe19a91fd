"""Published figures as data (issue 17): reference/published.csv is whole and sourced, its
model names are ours, its figures are the shared list's, and the charts, report.html and the
notebook show them beside the runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.analysis import published as pub
from bench.analysis.stats import summarise
from bench.plan.config import PRECISIONS
from bench.records.store import record_path, write_json_atomic
from bench.report.summary import build_report
from models import available_models, get_spec
from tests.helpers.cli import REPO
from tests.helpers.records import model_record

SHARED = REPO.parent / "shared" / "reference" / "published.csv"
TF_URL = pub.load_published()[0]["url"]


def sweep(out: Path, runs: list[tuple[str, int, float]]) -> Path:
    for model, n, ips in runs:
        rec = model_record(model, n, ips)
        write_json_atomic(record_path(out, rec["run_id"]), rec)
    return out


def test_every_row_has_a_source_a_url_and_numbers() -> None:
    with open(pub.PUBLISHED, newline="") as fh:
        assert tuple(csv.DictReader(fh).fieldnames or ()) == pub.FIELDS
    rows = pub.load_published()
    assert len(rows) >= 60
    for r in rows:
        assert r["source"] and r["source_short"] and r["series"], r
        assert r["url"].startswith("https://"), r
        assert r["hardware"] and r["gpu"] and r["system"], r
        assert isinstance(r["gpus"], int) and r["gpus"] >= 1, r
        # a figure: images/sec, or (language models, issue 27) tokens/s per GPU or TFLOPS/GPU
        assert any((r[k] or 0) > 0 for k in ("images_per_sec", "tokens_per_sec_per_gpu",
                                             "tflops_per_gpu")), r
        assert r["data"] in {"synthetic", "real"} and r["data_detail"].startswith(r["data"]), r
        assert r["precision"] in PRECISIONS, r
        if r["global_batch"] is not None and r["batch_per_gpu"] is not None:
            assert r["global_batch"] == pytest.approx(r["batch_per_gpu"] * r["gpus"], abs=0.1)


def test_model_names_are_ours_and_say_how_the_published_model_differs() -> None:
    rows = pub.load_published()
    assert {r["model"] for r in rows if r["model_match"] != "other"} <= set(available_models())
    assert "v1.5" in get_spec("resnet50").description  # what "exactly ours" rests on
    for r in rows:
        assert r["model_match"] in {"exact", "variant", "other"} and r["model_note"], r
        if r["model_match"] == "other":  # not ours: the published name kept, never ours
            assert r["model"] not in available_models(), r
        if r["model_as_published"] == "resnet50v1.5":
            assert (r["model"], r["model_match"]) == ("resnet50", "exact"), r
        if r["model_as_published"] == "resnet50":  # v1 (or MXNet's): not exactly ours
            assert (r["model"], r["model_match"]) == ("resnet50", "variant"), r
    seed4 = [r for r in rows if r["model"] == "minigooglenet"]
    assert len(seed4) == 2 and all(r["model_match"] == "exact" for r in seed4)


def test_amp_sources_are_mixed_precision_and_the_rest_fp32() -> None:
    for r in pub.load_published():
        if r["strategy"]:  # issue 27's sources: bf16 (torchtitan, llm-foundry), fp16 (ZeRO)
            assert r["precision"] == ("fp16" if "DeepSpeed" in r["source"] else "bf16"), r
            continue
        amp = r["source"].startswith(("NVIDIA DeepLearningExamples", "lambdal/"))
        assert r["precision"] == ("fp16" if amp else "fp32"), r


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared/reference/published.csv here")
def test_figures_are_the_shared_list_s() -> None:
    """Every figure of ../shared/reference/published.csv is one row here, same numbers; its
    rows without images/sec (multi-node) are reference/multi_node.csv's."""
    shared = list(csv.DictReader(SHARED.open(newline="")))
    shared_sources = {r["source"] for r in shared}
    ours = [r for r in csv.DictReader(pub.PUBLISHED.open(newline=""))
            if r["source"] in shared_sources]  # issue 27's sources are not in the shared list
    keys = ("source", "system", "hardware", "gpus", "batch_per_gpu", "images_per_sec")

    def key(r: dict, model: str, data: str) -> tuple:
        return (*(r[k] for k in keys), r[model], r[data])

    mine = [key(r, "model_as_published", "data_detail") for r in ours]
    assert len(mine) == len(set(mine))
    figures = [r for r in shared if r["images_per_sec"]]
    assert sorted(mine) == sorted(key(r, "model", "data") for r in figures)
    multi = {(r["model"], r["gpus"]) for r in pub.load_multi_node()}
    for r in shared:
        if not r["images_per_sec"]:
            assert (r["model"], r["gpus"]) in multi, r


def test_efficiency_is_against_the_series_one_gpu_figure() -> None:
    """As the sources compute it: rossumai's tables give these efficiencies."""
    rows = pub.load_published()
    for series in {r["series"] for r in rows}:
        assert sum(r["gpus"] == 1 for r in rows if r["series"] == series) <= 1, series

    def eff(system: str, hardware: str, gpus: int) -> float | None:
        return next(r["scaling_efficiency"] for r in rows if r["system"] == system
                    and r["hardware"].startswith(hardware) and r["gpus"] == gpus)

    assert eff("tf_cnn_benchmarks ps=cpu NCHW", "7gforce", 2) == pytest.approx(0.8180, abs=5e-5)
    assert eff("keras-tf kuza55 make_parallel ps=cpu", "az-2x-m60", 2) == \
        pytest.approx(0.8602, abs=5e-5)
    assert eff("keras-tf kuza55 make_parallel ps=gpu", "az-2x-m60", 2) == \
        pytest.approx(0.8057, abs=5e-5)
    assert eff("keras-tf multi_gpu_model", "4x Titan X", 4) == pytest.approx(3125 / 794 / 4)
    assert eff("keras-mxnet", "DGX-1", 8) is None  # seed 000 gives no 1-GPU figure


def test_select_filters_by_model_devices_data_and_precision() -> None:
    rows = pub.load_published()
    assert pub.select(rows) == rows
    mini = pub.select(rows, models=["minigooglenet"])
    assert [r["gpus"] for r in mini] == [1, 4]
    assert [r["images_per_sec"] for r in pub.select(mini, devices=[4])] == [3125]
    assert pub.select(mini, data=["synthetic"]) == []
    amp = [r for r in pub.select(rows, precision=["fp16"]) if not r["strategy"]]
    assert amp and {r["model_as_published"] for r in amp} == {"resnet50v1.5"}
    six = pub.select(rows, models=["resnet50"], devices=[6])
    assert six and all(r["hardware"].startswith("7gforce") for r in six)


def test_chart_draws_published_points_where_model_and_devices_match() -> None:
    """Published rows of the model at the device counts run: those within 3x of the measured
    maximum at their value, the rest marked off axis; none for a model without rows there."""
    from bench.plotting import pyplot

    plt = pyplot()
    measured = summarise([model_record("resnet50", 1, 150.0), model_record("resnet50", 2, 290.0),
                          model_record("minigooglenet", 2, 40.0)])
    fig, ax = plt.subplots()
    ax.set_ylim(0, 300)
    drawn = pub.draw_published(ax, "resnet50", measured)
    assert drawn and {r["gpus"] for r in drawn} == {1, 2}
    labels = ax.get_legend_handles_labels()[1]
    assert "published: P100, TF docs 2017" in labels  # 195-425 img/s: within 3 x 290
    # the A100/H100/H200 figures (2,470-3,411) are not drawn at their value
    assert any(t.startswith("published, off axis: 4 systems") for t in labels), labels
    assert ax.get_yscale() == "linear" and ax.get_ylim()[1] < 3 * 290
    assert {x for line in ax.get_lines() for x in line.get_xdata()} <= {1, 2}
    fig2, ax2 = plt.subplots()  # seed 004 has 1 and 4 GPUs: none at 2 devices
    assert pub.draw_published(ax2, "minigooglenet", measured) == []
    assert ax2.get_lines() == [] and ax2.get_yscale() == "linear"
    fig3, ax3 = plt.subplots()
    ax3.set_ylim(0, 1.1)
    eff = pub.draw_published(ax3, "resnet50", measured, "scaling_efficiency")
    assert all(r["scaling_efficiency"] is not None for r in eff)
    assert ax3.get_yscale() == "linear" and ax3.get_ylim()[0] == 0
    for f in (fig, fig2, fig3):
        plt.close(f)


def test_throughput_chart_of_a_sweep_has_the_published_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """render_charts calls draw_published: the legends of the saved throughput and efficiency
    charts name the published rows of resnet50, none of minigooglenet at 2 devices."""
    import bench.report.charts as charts

    legends: dict[str, list[list[str]]] = {}
    save = charts.save

    def spy(fig, path, plt):  # type: ignore[no-untyped-def]
        # the legend wraps long labels: compare them unwrapped
        legends[Path(path).name] = [[" ".join(t.get_text().split())
                                     for t in ax.get_legend().get_texts()]
                                    if ax.get_legend() else [] for ax in fig.axes]
        return save(fig, path, plt)

    monkeypatch.setattr(charts, "save", spy)
    out = sweep(tmp_path / "s", [("minigooglenet", 1, 30.0), ("minigooglenet", 2, 50.0),
                                 ("resnet50", 1, 3.0), ("resnet50", 2, 5.0)])
    build_report(out)
    mini, resnet = legends["throughput.png"]
    # CPU figures: every GPU figure is off axis, the 794 img/s of seed 004 with its value
    assert any(t.startswith("published, off axis: ") for t in resnet), resnet
    assert ("published: Titan X, seed 004 PyImageSearch 2017, real data: 794 img/s at 1, "
            "off axis") in mini, mini
    mini, resnet = legends["efficiency.png"]  # efficiency is scale-free: drawn at its value
    assert "published: P100, TF docs 2017" in resnet
    assert "published: Titan X, seed 004 PyImageSearch 2017, real data" in mini
    assert (out / "charts" / "throughput.png").stat().st_size > 0


def test_report_html_always_has_the_published_section(tmp_path: Path) -> None:
    out = sweep(tmp_path / "s", [("resnet50", 1, 3.0), ("resnet50", 2, 5.0),
                                 ("probe", 1, 100.0)])
    build_report(out)
    page = (out / "report.html").read_text()
    assert '<h2 id="published">Published figures</h2>' in page
    assert "<h3>resnet50</h3>" in page and f'href="{TF_URL}"' in page
    assert "<td><b>2</b></td>" in page and "<td>8</td>" in page  # the sweep ran 1 and 2
    assert "No published figure for probe" in page
    assert "96%" in page  # TF docs DGX-1: 422 / (219 x 2)
    assert "Across nodes" not in page
    alone = sweep(tmp_path / "p", [("probe", 1, 100.0)])
    build_report(alone)
    page = (alone / "report.html").read_text()
    assert "Published figures</h2>" in page and "No published figure for probe" in page


def test_multi_node_sweep_shows_the_multi_node_figures() -> None:
    html = pub.published_section([model_record("resnet50", 4, 10.0, nodes=2)])
    assert "Across nodes (reference/multi_node.csv)</h3>" in html
    assert "https://arxiv.org/abs/1706.02677" in html and "90% vs 8 GPUs" in html
    assert "1802.05799" not in html  # Horovod's rows are ResNet-101, Inception V3, VGG-16


def test_notebook_loads_the_published_figures_next_to_the_records() -> None:
    nbformat = pytest.importorskip("nbformat")
    frame = pub.load_published_frame(models=["minigooglenet"])
    assert list(frame.columns) == [*pub.FIELDS, "scaling_efficiency"]
    assert frame["images_per_sec"].tolist() == [794, 3125]
    nb = nbformat.read(REPO / "notebooks" / "explore_results.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    load = next(i for i, s in enumerate(code) if "load_results(folder)" in s)
    pubs = next(i for i, s in enumerate(code) if "load_published_frame(" in s)
    assert pubs > load and 'df["model"]' in code[pubs]


# -- issue 27: the sharded-training sources ----------------------------------------------------

def test_sharded_training_rows_are_sourced_at_a_commit_with_their_settings() -> None:
    rows = pub.strategy_rows()
    by_source = {r["source_short"] for r in rows}
    assert {"torchtitan 2024-12", "llm-foundry MPT", "DeepSpeed ZeRO-2 2020",
            "DeepSpeed ZeRO-3 Offload 2021"} <= by_source
    for r in rows:
        assert len(r["commit"]) == 40 and r["commit"] in r["url"], r
        assert r["strategy"].split("[")[0] in {"torch_fsdp2", "deepspeed"}, r
        assert r["mfu"] is None or 0 < r["mfu"] < 1, r
    # torchtitan Table 1: FSDP, Llama 3.1 8B, 8 H100s, local batch 2: 5,762 tokens/s per GPU
    tt = next(r for r in rows if r["system"] == "torchtitan FSDP" and r["gpus"] == 8)
    assert (tt["tokens_per_sec_per_gpu"], tt["memory_gib_per_gpu"], tt["batch_per_gpu"],
            tt["seq_len"]) == (5762, 82.4, 2, 8192)
    # llm-foundry's MPT-125m on 8 A100 80GB at seq 2048: our gpt2's shape, a variant
    mpt = [r for r in rows if r["model"] == "gpt2"]
    assert mpt and all(r["model_match"] == "variant" and r["gpu"] == "A100" for r in mpt)
    seq2048 = next(r for r in mpt if r["seq_len"] == 2048)
    assert (seq2048["mfu"], seq2048["tokens_per_sec"], seq2048["images_per_sec"]) == \
        (0.4445, 1133901, 553)
    zero2 = next(r for r in rows if r["strategy"] == "deepspeed[stage=2]")
    assert (zero2["gpus"], zero2["tflops_per_gpu"]) == (400, 38)


def test_a_published_file_without_the_new_columns_still_loads(tmp_path: Path) -> None:
    old = tmp_path / "old.csv"
    head = list(pub.FIELDS[:19])  # the columns before issue 27
    rows = list(csv.DictReader(pub.PUBLISHED.open(newline="")))[:2]
    with old.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=head, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    loaded = pub.load_published(old)
    assert len(loaded) == 2 and loaded[0]["images_per_sec"] == 219
    assert loaded[0]["strategy"] == "" and loaded[0]["mfu"] is None


def test_report_lists_the_strategy_columns_for_gpt2(tmp_path: Path) -> None:
    html_text = pub.published_section([{"model": "gpt2", "num_devices": 8}])
    assert "llm-foundry" in html_text and "tokens/s/GPU" in html_text and "44.5%" in html_text
    assert "torch_fsdp2[reshard_after_forward=true]" in html_text
