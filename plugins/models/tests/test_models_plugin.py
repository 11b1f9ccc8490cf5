"""poot-models registers through the entry point and its families come from the hook."""

from poot.plugins import host


def test_registered_through_the_entry_point():
    info = {i.name: i for i in host().infos}["models"]
    assert info.status == "loaded" and info.distribution == "poot-models"
