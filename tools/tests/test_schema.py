"""mhapy.schema.upgraded_context: the one place that reads older result files. A file of the
current version is read as it is; a version-1 file (written before the version) upgraded; a
newer or malformed version refused naming it, by the report too."""

from __future__ import annotations

import json

import pytest

from mhapy import schema
from mhapy.report import cli
from mhapy.report.loading import load
from mhapy.report.results import ReportError

CURRENT = {
    schema.SCHEMA_VERSION_KEY: str(schema.SCHEMA_VERSION),
    "mha_version": "0.1",
    "mha_dispatch": "avx2",
    "mha_fma_peak_isa": "avx2",
    "mha_fma_peak_gflops_one_core": "60.0",
    "mha_fma_peak_gflops_one_core_avx2": "60.0",
}


def test_a_current_file_is_read_as_it_is():
    got = schema.upgraded_context(CURRENT, {"tbb"}, "x.json")
    assert got == dict(CURRENT, **{schema.SCHEMA_VERSION_KEY: schema.SCHEMA_VERSION})


def test_a_file_written_before_the_version_is_upgraded():
    old = {
        "mha_version": "0.1",
        "mha_backend_xsimd_description": "xsimd kernels, avx512bw (8 floats)",
        "mha_fma_peak_isa": "avx512",
        "mha_fma_peak_gflops_one_core": "120.5",
        "mha_fma_peak_gflops_all_cores": "240.0",
    }
    got = schema.upgraded_context(old, {"xsimd"}, "old.json")
    assert got[schema.SCHEMA_VERSION_KEY] == schema.SCHEMA_VERSION
    assert got["mha_dispatch"] == "avx512"  # from xsimd's description
    assert got["mha_fma_peak_gflops_one_core_avx512"] == "120.5"
    assert got["mha_fma_peak_gflops_all_cores_avx512"] == "240.0"
    assert "mha_dispatch" not in old  # the caller's dict is left alone
    # Without a description naming an ISA: the peak's ISA.
    assert (
        schema.upgraded_context({"mha_fma_peak_isa": "avx2"}, {"naive"}, "o.json")["mha_dispatch"] == "avx2"
    )


def test_an_old_peers_file_is_told_by_its_backends():
    got = schema.upgraded_context({"cpu_model": "X"}, {"torch_sdpa", "openvino_u8kv"}, "p.json")
    assert got["mha_peers"] == "OpenVINO,PyTorch"
    assert "mha_dispatch" not in got  # a peers' file joins every machine of its CPU


@pytest.mark.parametrize(
    "version, message",
    [
        (
            str(schema.SCHEMA_VERSION + 1),
            f"schema version {schema.SCHEMA_VERSION + 1}; this mhapy reads versions 1 to",
        ),
        ("0", "schema version 0; this mhapy reads versions 1 to"),
        ("two", "context mha_schema_version 'two' is not a version number"),
    ],
)
def test_a_version_this_mhapy_cannot_read_is_refused_by_name(tmp_path, version, message):
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"context": dict(CURRENT, mha_schema_version=version), "benchmarks": []}))
    with pytest.raises(ReportError, match=message) as e:
        load([path])
    assert str(path) in str(e.value)
    assert cli.main([str(path), "--out", str(tmp_path / "report")]) != 0
