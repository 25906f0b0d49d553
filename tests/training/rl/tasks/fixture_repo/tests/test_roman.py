import pytest
from textkit import to_roman


@pytest.mark.parametrize(("number", "numeral"), [(4, "IV"), (1994, "MCMXCIV")])
def test_to_roman(number, numeral):
    assert to_roman(number) == numeral


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)
