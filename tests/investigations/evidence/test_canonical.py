"""One canonical JSON text: key order and spacing never change the text, and the two uses keep
their own form of non-ASCII characters (record keys must not change from crawl to crawl)."""

from __future__ import annotations

import hashlib

from investigations.adapters.base import make_record
from investigations.evidence.canonical import canonical_json


def test_equal_values_give_equal_text_whatever_their_key_order() -> None:
    assert canonical_json({"b": [1, 2], "a": {"y": 1, "x": None}}) == '{"a":{"x":null,"y":1},"b":[1,2]}'


def test_stored_text_keeps_non_ascii_characters_and_key_text_escapes_them() -> None:
    assert canonical_json({"name": "Zoë"}) == '{"name":"Zoë"}'
    assert canonical_json({"name": "Zoë"}, ascii_only=True) == '{"name":"Zo\\u00eb"}'


def test_a_record_key_made_from_non_ascii_fields_is_the_one_earlier_crawls_stored() -> None:
    record = make_record({"name": "Zoë", "handle": "zoe"}, page_url="https://example.test/", raw_key=None)
    # The hash of the ASCII-escaped text: what every earlier version of the fleet stored as the key.
    assert record.key == hashlib.sha256(b'{"handle":"zoe","name":"Zo\\u00eb"}').hexdigest()[:16]


def test_values_json_cannot_hold_are_written_as_text() -> None:
    assert canonical_json({"at": b"x"}) == '{"at":"b\'x\'"}'
