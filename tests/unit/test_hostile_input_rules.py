"""Pure checks behind issue 8.3/8.5: string fields refuse control characters, names are full
matches, JSON nesting is bounded, and the token buckets / log throttle keep their promises."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordination.wire import InvalidRequest, parse_heartbeat
from coordinator_project.logging import LogThrottle
from dataplane.protocol import MEMBER_ID_RE
from groups.api_parsers import MAX_JSON_DEPTH, nested_too_deep
from groups.ratelimit import TokenBuckets
from groups.services import GROUP_NAME_RE, KEY_PREFIX_RE, STREAM_NAME_RE

controls = st.sampled_from([chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]] + ["\ud800", "\udfff"])


@given(st.text(max_size=10), controls, st.text(max_size=10))
def test_any_control_character_in_client_id_is_refused_naming_it(before: str, bad: str, after: str):
    with pytest.raises(InvalidRequest, match=r"^clientId: must not contain control or format characters"):
        parse_heartbeat({"memberId": "m1", "memberEpoch": 0, "clientId": before + bad + after})


# Unicode category Cf: bidi overrides and isolates, zero-width characters, the BOM, soft hyphen.
format_chars = st.sampled_from(["\u202e", "\u202a", "\u2066", "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad",
                                "\U000e0001"])


@given(st.text(alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs")), max_size=10), format_chars,
       st.text(alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs")), max_size=10))
def test_i27_10_format_characters_in_client_id_are_refused_naming_the_field(before: str, bad: str, after: str):
    with pytest.raises(InvalidRequest, match=r"^clientId: must not contain control or format characters"):
        parse_heartbeat({"memberId": "m1", "memberEpoch": 0, "clientId": before + bad + after})


def test_i27_10_other_non_ascii_client_ids_still_pass():
    assert parse_heartbeat({"memberId": "m1", "memberEpoch": 0, "clientId": "hôte-é/東京/pid 7"}).client_id


@given(controls)
def test_control_characters_in_every_shard_list_are_refused_naming_the_entry(bad: str):
    body = {"memberId": "m1", "memberEpoch": 3, "ownedShards": ["s:1:0", f"s:1:1{bad}"],
            "drainedShards": [f"{bad}"], "revokingShards": [{"shard": f"s{bad}:1:2", "state": "REVOKED"}]}
    with pytest.raises(InvalidRequest) as err:
        parse_heartbeat(body)
    assert {p.split(":")[0] for p in err.value.problems} == {
        "ownedShards[1]", "drainedShards[0]", "revokingShards[0].shard"}


@pytest.mark.parametrize("pattern", [MEMBER_ID_RE, GROUP_NAME_RE, STREAM_NAME_RE, KEY_PREFIX_RE])
@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\x00"])
def test_name_patterns_refuse_a_trailing_newline_even_with_match(pattern, suffix):
    assert pattern.fullmatch("name1")
    assert pattern.match("name1")
    assert not pattern.fullmatch("name1" + suffix)
    assert not pattern.match("name1" + suffix)


@given(st.integers(min_value=1, max_value=3 * MAX_JSON_DEPTH))
def test_nesting_check_agrees_with_the_real_depth(depth: int):
    raw = ("[" * depth + "]" * depth).encode()
    assert nested_too_deep(raw, json.loads(raw)) == (depth > MAX_JSON_DEPTH)


def test_nesting_check_counts_objects_and_skips_wide_flat_bodies():
    wide = {"revokingShards": [{"shard": f"s:1:{i}", "state": "REVOKED"} for i in range(5000)]}
    raw = json.dumps(wide).encode()
    assert not nested_too_deep(raw, wide)
    deep: object = {}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"a": deep}
    assert nested_too_deep(json.dumps(deep).encode(), deep)


def test_token_bucket_allows_the_burst_then_the_rate():
    b = TokenBuckets()
    assert [b.take("k", rate=2, burst=3, now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take("k", rate=2, burst=3, now=0.0) == pytest.approx(0.5)
    assert b.take("k", rate=2, burst=3, now=0.5) == 0.0  # one token back after 1/rate s
    assert b.take("other", rate=2, burst=3, now=0.5) == 0.0  # keys are independent
    assert b.take("k", rate=0, burst=0, now=0.5) == 0.0  # rate 0: no limit


def test_token_buckets_stay_bounded():
    b = TokenBuckets(max_keys=100)
    for i in range(1000):
        b.take(i, rate=1, burst=1, now=0.0)
    assert len(b._buckets) <= 100


def test_log_throttle_lets_one_line_per_period_and_counts_the_rest():
    t = LogThrottle(every=10.0)
    assert t.allow("AUTHENTICATION_FAILED", now=0.0) == 0
    assert [t.allow("AUTHENTICATION_FAILED", now=s) for s in (1.0, 2.0, 9.9)] == [None, None, None]
    assert t.allow("RATE_LIMITED", now=5.0) == 0
    assert t.allow("AUTHENTICATION_FAILED", now=10.0) == 3
