"""The descriptor's exact thresholds, validation and JSON round trip."""

import mpmath
import pytest

from stepscope import Refusal
from stepscope.stats import HistogramDescriptor


@pytest.mark.parametrize("bpo", [1, 2, 3, 4, 5, 7, 8, 16, 64])
@pytest.mark.parametrize("p", [23, 52])
def test_thresholds_match_high_precision_roots(bpo, p):
    # independent oracle: 2**(j/bpo) to 60 significant digits with mpmath
    mpmath.mp.dps = 60
    thr = HistogramDescriptor(bins_per_octave=bpo).mantissa_thresholds(p)
    assert len(thr) == bpo - 1
    for j, t in enumerate(thr, start=1):
        edge = mpmath.power(2, mpmath.mpf(j) / bpo)
        assert 1 + mpmath.mpf(t) / 2**p >= edge  # t reaches the edge
        assert 1 + mpmath.mpf(t - 1) / 2**p < edge  # t - 1 does not


def test_default_shape_and_round_trip():
    d = HistogramDescriptor()
    assert (d.n_bins, d.width) == (256, 520)
    assert HistogramDescriptor.from_dict(d.to_dict()) == d
    assert d.edges()[0] == 2.0**-48 and d.edges()[-1] == 2.0**16
    assert len(d.digest) == 16


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": 10},
        {"bins_per_octave": 0},
        {"bins_per_octave": 65},
        {"lo_exp": 4, "hi_exp": 4},
        {"lo_exp": -1023},
        {"hi_exp": 1025},
        {"signed": False},
        {"encoding": "linear"},
    ],
)
def test_invalid_descriptors_refuse(kwargs):
    with pytest.raises(Refusal) as err:
        HistogramDescriptor(**kwargs)
    assert err.value.code == "descriptor_invalid"


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(Refusal) as err:
        HistogramDescriptor.from_dict({"bins_per_octave": 4, "rebin": True})
    assert err.value.code == "descriptor_invalid"
    with pytest.raises(Refusal):
        HistogramDescriptor.from_dict("nope")  # type: ignore[arg-type]
