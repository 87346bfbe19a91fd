"""The equivalence coverage table (docs/EQUIVALENCE.md, bench/catalog/equivalence_coverage.py):
current,
and every listed case a real option set of its runner. Fast: no framework."""

from __future__ import annotations

import pytest

from bench.catalog import custom_models_doc
from bench.catalog import equivalence_coverage as cov
from bench.catalog.registry import RUNNERS


def test_the_table_in_the_docs_is_current() -> None:
    text = cov.DOC.read_text()
    assert cov.with_markdown(text) == text, \
        ("docs/EQUIVALENCE.md is out of date: "
         "python -m bench.catalog.equivalence_coverage --markdown")


def test_the_custom_models_table_in_models_md_is_current() -> None:
    """docs/MODELS.md's runners per framework are the catalogs' custom_models (issue 41)."""
    text = custom_models_doc.DOC.read_text()
    assert "| torch | torch_ddp, torch_zero1, torch_fsdp2, deepspeed, horovod |" in text
    assert custom_models_doc.with_markdown(text) == text, \
        "docs/MODELS.md is out of date: python -m bench.catalog.custom_models_doc --markdown"


@pytest.mark.parametrize("name", sorted(n for n, r in RUNNERS.items() if r.equivalence))
def test_every_case_sets_real_options_to_allowed_values(name: str) -> None:
    info = RUNNERS[name]
    gpu_only = [options for options, why in info.equivalence_gpu_only if why.strip()]
    assert len(gpu_only) == len(info.equivalence_gpu_only), "a GPU-only case needs its reason"
    for options in (*info.equivalence_options, *gpu_only):
        for key, value in options.items():
            assert key in info.options, (name, key)
            assert info.options[key].allowed is None or value in info.options[key].allowed, \
                (name, key, value)
            assert value != info.options[key].default, (name, key, "is the default")
    assert not [o for o in gpu_only if o in info.equivalence_options], \
        f"{name}: a case both runs here and is GPU only"


def test_gpu_only_cases_are_not_run_here() -> None:
    here = cov.cases_run_here()
    assert any(info.equivalence_gpu_only for info in RUNNERS.values())
    for name, info in RUNNERS.items():
        for options, _ in info.equivalence_gpu_only:
            assert (name, options) not in here
    table = cov.rows()
    assert sum(w == cov.RUNS_HERE for _, _, w in table) == len(here)
