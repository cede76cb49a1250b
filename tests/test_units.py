import pytest

from launcher.errors import UserInputError
from launcher.units import fmt_bytes, fmt_count, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("4TB", 4 * 10**12),
        ("1.5 TiB", int(1.5 * 2**40)),
        ("512M", 512 * 2**20),
        (1073741824, 2**30),
        ("141GB", 141 * 10**9),
        ("100", 100),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text, "x") == expected


def test_parse_bandwidth_needs_per_second():
    assert parse_size("25GB/s", "pcie.bandwidth", per_second=True) == 25 * 10**9
    with pytest.raises(UserInputError, match="needs '/s'"):
        parse_size("25GB", "pcie.bandwidth", per_second=True)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-80GiB", "must not be negative"),
        (-5, "must not be negative"),
        (80.5, "has no unit"),
        ("1.5", "has no unit"),
        ("80 parsecs", "unknown unit"),
        ("lots", "cannot read"),
        (True, "expected a size"),
    ],
)
def test_parse_size_errors_name_the_field(value, message):
    with pytest.raises(UserInputError, match=message) as info:
        parse_size(value, "gpus.memory")
    assert str(info.value).startswith("gpus.memory")


def test_formatting():
    assert fmt_bytes(14 * 2**30) == "14.0 GiB"
    assert fmt_bytes(512) == "512 B"
    assert fmt_count(6_738_415_616) == "6,738,415,616 (6.74 B)"
