"""A/B mode: ratio of medians, noise verdicts (U-test and the range fallback), unmatched names."""

import math

import pytest
from conftest import entries, write

from mhapy.report import ab
from mhapy.problem import Shape
from mhapy.report.loading import load
from mhapy.report.results import Key

S = Shape(4, 256, 768, 768, 12)
FIVE = (0.97, 0.99, 1.0, 1.01, 1.03)


def results(path, benchmarks):
    """The ResultSet of one file holding `benchmarks`."""
    return load([write(path, benchmarks)])


def pair(tmp_path, before_s, after_s, before_spread=FIVE, after_spread=FIVE, backend="xsimd"):
    before = results(
        tmp_path / "before.json", entries(backend, "split_weight", S, 1, before_s, spread=before_spread)
    )
    after = results(
        tmp_path / "after.json", entries(backend, "split_weight", S, 1, after_s, spread=after_spread)
    )
    return before, after


def test_smallest_p_of_the_exact_u_test():
    assert ab.smallest_p(3, 3) == pytest.approx(0.1)
    assert ab.smallest_p(4, 4) == pytest.approx(2 / 70)
    assert ab.smallest_p(1, 1) == 1.0


def test_repetitions_the_u_test_needs_follow_alpha():
    # 2 / C(8, 4) = 0.029 < 0.05 but 2 / C(6, 3) = 0.1 is not; 2 / C(10, 5) = 0.0079 < 0.01.
    assert ab.repetitions_for_u_test(0.05) == 4
    assert ab.repetitions_for_u_test(0.01) == 5
    assert ab.repetitions_for_u_test(0.2) == 3


@pytest.mark.skipif(ab.mannwhitneyu is None, reason="scipy not installed")
def test_u_test_flags_a_clear_change_and_reports_scipys_p_value(tmp_path):
    before, after = pair(tmp_path, 0.010, 0.005)
    ((c,), only_before, only_after) = ab.compare(before, after)
    assert c.ratio == pytest.approx(0.5)
    assert (c.method, c.verdict) == ("U-test", "faster")
    expected = ab.mannwhitneyu(
        before.measurements[c.key].times_s, after.measurements[c.key].times_s, alternative="two-sided"
    ).pvalue
    assert c.p_value == pytest.approx(expected)
    assert c.p_value < 0.05
    assert only_before == only_after == []


@pytest.mark.skipif(ab.mannwhitneyu is None, reason="scipy not installed")
def test_u_test_calls_interleaved_repetitions_noise(tmp_path):
    # Medians 2% apart but the repetitions interleave: not a change.
    before, after = pair(tmp_path, 0.0100, 0.0102)
    ((c,), _, _) = ab.compare(before, after)
    assert c.ratio == pytest.approx(1.02)
    assert (c.method, c.verdict) == ("U-test", "noise")
    assert c.p_value > 0.05


def test_range_rule_with_three_repetitions_or_without_scipy(tmp_path):
    three = (0.99, 1.0, 1.01)
    before, after = pair(tmp_path, 0.010, 0.012, three, three)
    ((c,), _, _) = ab.compare(before, after)
    assert (c.method, c.verdict, c.p_value) == ("ranges", "slower", None)
    assert c.ratio == pytest.approx(1.2)
    before, after = pair(tmp_path, 0.0100, 0.0101, three, three)  # ranges overlap
    assert ab.compare(before, after)[0][0].verdict == "noise"
    before, after = pair(tmp_path, 0.010, 0.005)  # five repetitions, scipy switched off
    ((c,), _, _) = ab.compare(before, after, use_scipy=False)
    assert (c.method, c.verdict) == ("ranges", "faster")


def test_range_rule_when_scipy_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "mannwhitneyu", None)
    before, after = pair(tmp_path, 0.010, 0.020)
    assert ab.compare(before, after)[0][0].method == "ranges"


def test_single_repetition_has_no_noise_verdict(tmp_path):
    before, after = pair(tmp_path, 0.010, 0.020, (1.0,), (1.0,))
    ((c,), _, _) = ab.compare(before, after)
    assert c.ratio == pytest.approx(2.0)
    assert (c.method, c.verdict) == ("n/a", "n/a")


def test_unmatched_benchmarks_and_geomean(tmp_path):
    other = Shape(1, 128, 64, 64, 1)
    before = results(
        tmp_path / "b.json",
        entries("naive", "wrapper", S, 1, 1.0)
        + entries("naive", "wrapper", other, 1, 1.0)
        + entries("onednn", "wrapper", S, 1, 1.0),
    )
    after = results(
        tmp_path / "a.json",
        entries("naive", "wrapper", S, 1, 2.0)
        + entries("naive", "wrapper", other, 1, 0.5)
        + entries("tbb", "wrapper", S, 1, 1.0),
    )
    comparisons, only_before, only_after = ab.compare(before, after)
    assert [c.key for c in comparisons] == sorted(
        [Key("naive", "wrapper", S, 1), Key("naive", "wrapper", other, 1)]
    )
    assert only_before == [Key("onednn", "wrapper", S, 1)]
    assert only_after == [Key("tbb", "wrapper", S, 1)]
    ((name, count, geomean),) = ab.geomean_ratios(comparisons)
    assert (name, count) == ("naive · wrapper", 2)
    assert geomean == pytest.approx(math.sqrt(2.0 * 0.5))
