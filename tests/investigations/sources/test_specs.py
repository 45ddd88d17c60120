"""Source specs: the repo's sources.yaml loads, and every broken file fails at load naming what is wrong."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from investigations.sources.specs import (
    RecrawlSpec,
    SourceSpec,
    SpecError,
    duration_text,
    load_sources,
    parse_duration_s,
    parse_sources,
)

ROOT = Path(__file__).resolve().parents[3]
SANDBOX = "http://127.0.0.1:8123"

# One valid source; each broken case below changes one thing about it.
ALPHA = """\
sources:
  - name: alpha
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "http://127.0.0.1:1/x?q={value}"}
"""
REQUEST_LINE = '    request: {url: "http://127.0.0.1:1/x?q={value}"}\n'


def parse(text: str, env: dict[str, str] | None = None):
    return parse_sources(text, origin="fleet.yaml", env=env or {})


def spec_error(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(SpecError) as raised:
        parse(text, env)
    return str(raised.value)


# -- the repo's own file ---------------------------------------------------------------------------


def test_repo_sources_file_loads_six_sources_in_file_order() -> None:
    catalog = load_sources(ROOT / "sources.yaml", env={"INVESTIGATIONS_SANDBOX_URL": SANDBOX})
    assert catalog.names == ["robust", "fragile", "flaky", "quiet", "slow", "changing"]


def test_repo_sources_file_has_one_source_on_a_learned_cadence() -> None:
    catalog = load_sources(ROOT / "sources.yaml", env={"INVESTIGATIONS_SANDBOX_URL": SANDBOX})
    assert [spec.name for spec in catalog.sources if not spec.recrawl.is_fixed] == ["changing"]


def test_repo_sources_file_points_every_source_at_the_sandbox_url_from_the_env() -> None:
    catalog = load_sources(ROOT / "sources.yaml", env={"INVESTIGATIONS_SANDBOX_URL": SANDBOX})
    assert all(spec.request.url.startswith(SANDBOX + "/") for spec in catalog.sources)


def test_load_sources_of_a_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "sources.yaml"
    with pytest.raises(SpecError, match="cannot read sources file") as raised:
        load_sources(missing, env={})
    assert str(missing) in str(raised.value)


def test_load_sources_names_the_file_in_validation_errors(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(ALPHA + "    colour: red\n")
    with pytest.raises(SpecError) as raised:
        load_sources(path, env={})
    assert str(raised.value).startswith(f"{path}: source 'alpha': key 'colour'")


# -- broken files: the message names the file, the source and the key -------------------------------

BROKEN_ENTRIES = [
    pytest.param(ALPHA + "    colour: red\n", "key 'colour': unknown key", id="unknown-top-level-key"),
    pytest.param(ALPHA + "    rate: {source_per_s: 1, burts: 3}\n", "key 'rate.burts': unknown key", id="unknown-nested-key"),
    pytest.param(ALPHA.replace(REQUEST_LINE, ""), "key 'request': Field required", id="missing-request"),
    pytest.param(ALPHA + "    rate: {source_per_s: -1}\n", "key 'rate.source_per_s': Input should be greater than 0",
                 id="negative-rate"),
    pytest.param(ALPHA + "    retry: {attempts: 0}\n", "key 'retry.attempts': Input should be greater than or equal to 1",
                 id="zero-attempts"),
    pytest.param(ALPHA + "    retry: {base_delay_s: 5, max_delay_s: 1}\n",
                 "key 'retry': max_delay_s (1.0) is below base_delay_s (5.0)", id="max-delay-below-base"),
    pytest.param(ALPHA.replace("json_api", "soap"), "unknown adapter 'soap'", id="unknown-adapter"),
    pytest.param(ALPHA.replace("[domain]", "[domain, phone]"), "key 'lead_kinds': unknown lead kinds ['phone']",
                 id="unknown-lead-kind"),
    pytest.param(ALPHA.replace("{value}", "{vaule}"), "key 'request.url': url uses unknown placeholders ['vaule']",
                 id="unknown-url-placeholder"),
    pytest.param(ALPHA.replace("http://127.0.0.1:1", "${NOPE_URL}"),
                 "key 'request.url': environment variable NOPE_URL is not set and has no default",
                 id="missing-env-var-without-default"),
    pytest.param(ALPHA + "    recrawl_every: 15 minutes\n", "key 'recrawl_every': '15 minutes' is not a duration",
                 id="bad-duration"),
    pytest.param(ALPHA + "    recrawl: {min: 1 hour, max: 30d}\n", "key 'recrawl.min': '1 hour' is not a duration",
                 id="bad-recrawl-bound"),
    pytest.param(ALPHA + "    recrawl: {min: 1h, max: 0}\n", "key 'recrawl.max': 0 must be longer than zero",
                 id="zero-recrawl-bound"),
    pytest.param(ALPHA + "    recrawl: {min: 30d, max: 1h}\n", "key 'recrawl': min (30d) is above max (1h)",
                 id="recrawl-min-above-max"),
    pytest.param(ALPHA + "    recrawl: {min: 1h, max: 30d, evry: 6h}\n", "key 'recrawl.evry': unknown key",
                 id="unknown-recrawl-key"),
    pytest.param(ALPHA + "    recrawl: {share: 1.5}\n", "key 'recrawl.share': Input should be less than or equal to 1",
                 id="recrawl-share-above-one"),
    pytest.param(ALPHA + "    recrawl_every: 6h\n    recrawl: {min: 1h, max: 30d}\n",
                 "keys 'recrawl_every' and 'recrawl' are both set", id="both-recrawl-keys"),
    pytest.param(ALPHA + "    interactive_slots: 0\n",
                 "key 'interactive_slots': Input should be greater than or equal to 1", id="no-interactive-slot"),
    pytest.param(ALPHA + "    throttle: {cut_hold_s: -1}\n",
                 "key 'throttle.cut_hold_s': Input should be greater than or equal to 0", id="negative-cut-hold"),
    pytest.param(ALPHA + "    throttle: {ceiling_margin: 1}\n", "key 'throttle.ceiling_margin': Input should be less than 1",
                 id="ceiling-margin-of-one"),
    pytest.param(ALPHA + "    throttle: {ceiling_hold_s: -5}\n",
                 "key 'throttle.ceiling_hold_s': Input should be greater than or equal to 0", id="negative-ceiling-hold"),
    pytest.param(ALPHA + "    throttle: {probe_step: 0}\n", "key 'throttle.probe_step': Input should be greater than 0",
                 id="zero-probe-step"),
    pytest.param(ALPHA + "    throttle: {increase_step: 0.01, probe_step: 0.02}\n",
                 "key 'throttle': probe_step (0.02) is above increase_step (0.01)", id="probe-faster-than-climb"),
    pytest.param(ALPHA + "    canaries: [{kind: username, value: alice}]\n",
                 "canaries of kinds ['username'] that the source does not take", id="canary-of-a-kind-not-taken"),
    pytest.param(ALPHA + "    canaries: [{kind: domain, value: 'not a domain'}]\n", "key 'canaries.0'",
                 id="canary-that-is-no-lead"),
]


@pytest.mark.parametrize(("text", "expected"), BROKEN_ENTRIES)
def test_a_broken_entry_fails_naming_file_source_and_key(text: str, expected: str) -> None:
    message = spec_error(text)
    assert message.startswith("fleet.yaml: source 'alpha': ")
    assert expected in message


def test_a_bad_source_name_is_rejected_naming_it() -> None:
    message = spec_error(ALPHA.replace("alpha", "Alpha-1"))
    assert message.startswith("fleet.yaml: source 'Alpha-1': key 'name': ")
    assert "lower-case letters" in message


def test_a_source_declared_twice_is_rejected_naming_it() -> None:
    message = spec_error(ALPHA + ALPHA.removeprefix("sources:\n"))
    assert "source 'alpha' is declared twice" in message


def test_a_key_given_twice_in_one_mapping_is_rejected_with_its_line() -> None:
    # PyYAML would silently keep the last value; the loader refuses and points at the second one.
    message = spec_error(ALPHA + "    adapter: html\n")
    assert message.startswith("fleet.yaml: not valid YAML: ")
    assert "key 'adapter' appears twice" in message
    assert "line 6" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("sources:\n  - just a string\n", "fleet.yaml: source #1: expected a mapping of settings",
                     id="entry-not-a-mapping"),
        pytest.param("- a\n- b\n", "fleet.yaml: expected a mapping with a `sources:` list", id="file-not-a-mapping"),
        pytest.param("", "fleet.yaml: expected a mapping with a `sources:` list", id="empty-file"),
        pytest.param(ALPHA + "extra: 1\n", "fleet.yaml: expected a mapping with a `sources:` list",
                     id="unknown-top-level-section"),
        pytest.param("defaults: [1]\n" + ALPHA, "fleet.yaml: `defaults:` must be a mapping", id="defaults-not-a-mapping"),
        pytest.param("sources: [\n", "fleet.yaml: not valid YAML: ", id="invalid-yaml"),
    ],
)
def test_a_broken_file_shape_is_rejected(text: str, expected: str) -> None:
    assert spec_error(text).startswith(expected)


def test_an_unknown_key_under_parse_is_named_with_its_path() -> None:
    message = spec_error(ALPHA + "    parse: {recods_path: x}\n")
    assert "source 'alpha': key 'parse.recods_path': unknown key" in message


def test_a_non_string_adapter_is_a_spec_error() -> None:
    message = spec_error(ALPHA.replace("adapter: json_api", "adapter: [json_api]"))
    assert "source 'alpha'" in message and "adapter" in message


# -- environment expansion ---------------------------------------------------------------------------


def test_env_var_default_is_used_when_the_var_is_unset() -> None:
    catalog = parse(ALPHA.replace("http://127.0.0.1:1", "${BASE_URL:-http://127.0.0.1:7000}"))
    assert catalog.get("alpha").request.url == "http://127.0.0.1:7000/x?q={value}"


def test_env_var_default_is_used_when_the_var_is_empty() -> None:
    catalog = parse(ALPHA.replace("http://127.0.0.1:1", "${BASE_URL:-http://127.0.0.1:7000}"), env={"BASE_URL": ""})
    assert catalog.get("alpha").request.url == "http://127.0.0.1:7000/x?q={value}"


def test_env_var_value_wins_over_the_default() -> None:
    catalog = parse(ALPHA.replace("http://127.0.0.1:1", "${BASE_URL:-http://127.0.0.1:7000}"),
                    env={"BASE_URL": "https://api.example.com"})
    assert catalog.get("alpha").request.url == "https://api.example.com/x?q={value}"


def test_env_vars_are_expanded_in_nested_values_such_as_headers() -> None:
    with_header = '    request: {url: "http://127.0.0.1:1/x?q={value}", headers: {X-Key: "${API_KEY}"}}\n'
    catalog = parse(ALPHA.replace(REQUEST_LINE, with_header), env={"API_KEY": "k-123"})
    assert catalog.get("alpha").request.headers == {"X-Key": "k-123"}


# -- defaults ---------------------------------------------------------------------------------------

DEFAULTS = """\
defaults:
  timeout_s: 5
  retry: {attempts: 4, base_delay_s: 0.5, max_delay_s: 10, step_retries: 2}
"""


def test_defaults_apply_to_an_entry_that_does_not_set_them() -> None:
    spec = parse(DEFAULTS + ALPHA).get("alpha")
    assert (spec.timeout_s, spec.retry.attempts, spec.retry.step_retries) == (5, 4, 2)


def test_an_entry_value_wins_over_the_default() -> None:
    spec = parse(DEFAULTS + ALPHA + "    timeout_s: 2\n").get("alpha")
    assert spec.timeout_s == 2


def test_nested_defaults_are_merged_key_by_key_with_the_entry_winning() -> None:
    spec = parse(DEFAULTS + ALPHA + "    retry: {attempts: 6, max_delay_s: 20}\n").get("alpha")
    assert spec.retry.model_dump() == {"attempts": 6, "base_delay_s": 0.5, "max_delay_s": 20, "step_retries": 2}


def test_the_repo_file_merges_its_retry_defaults_into_entries_that_override_part_of_them() -> None:
    catalog = load_sources(ROOT / "sources.yaml", env={"INVESTIGATIONS_SANDBOX_URL": SANDBOX})
    fragile = catalog.get("fragile")
    assert (fragile.retry.attempts, fragile.retry.base_delay_s, fragile.retry.step_retries) == (6, 1, 1)
    assert catalog.get("flaky").timeout_s == 2 and catalog.get("robust").timeout_s == 5


# -- durations --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("90", 90.0), (90, 90.0), ("90s", 90.0), ("15m", 900.0), ("6h", 21600.0), ("1d", 86400.0), ("1.5h", 5400.0)],
)
def test_parse_duration_s_reads_numbers_and_units(value: object, seconds: float) -> None:
    assert parse_duration_s(value) == seconds


@pytest.mark.parametrize("value", ["bad", "", "-5", "15 minutes", "6w", True, None])
def test_parse_duration_s_rejects_what_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s(value)


def test_recrawl_every_in_the_file_becomes_seconds() -> None:
    assert parse(ALPHA + "    recrawl_every: 6h\n").get("alpha").recrawl_every_s == 21600.0


@pytest.mark.parametrize(
    ("lines", "bounds", "prior_s", "fixed"),
    [
        # The old key: a fixed cadence, every lead every 6 h whatever its history.
        pytest.param("    recrawl_every: 6h\n", (21_600.0, 21_600.0), 21_600.0, True, id="recrawl_every-is-fixed"),
        # Neither key: once a day, as before.
        pytest.param("", (86_400.0, 86_400.0), 86_400.0, True, id="default-daily"),
        # Bounds only: new leads start from their geometric mean (1 h and 100 h: 10 h).
        pytest.param("    recrawl: {min: 1h, max: 100h}\n", (3_600.0, 360_000.0), 36_000.0, False, id="bounds-only"),
        pytest.param("    recrawl: {min: 15m, max: 30d, every: 6h}\n", (900.0, 2_592_000.0), 21_600.0, False,
                     id="bounds-and-every"),
        pytest.param("    recrawl: {}\n", (3_600.0, 2_592_000.0), math.sqrt(3_600.0 * 2_592_000.0), False,
                     id="defaults-1h-to-30d"),
    ],
)
def test_recrawl_bounds_and_prior_from_the_file(lines: str, bounds: tuple[float, float], prior_s: float,
                                                fixed: bool) -> None:
    recrawl = parse(ALPHA + lines).get("alpha").recrawl
    assert (recrawl.min_s, recrawl.max_s) == bounds
    assert recrawl.prior_s == pytest.approx(prior_s) and recrawl.is_fixed is fixed


def test_the_longest_a_lead_waits_is_the_fixed_cadence_or_the_learned_max() -> None:
    assert parse(ALPHA + "    recrawl_every: 6h\n").get("alpha").recrawl_every_s == 21_600.0
    assert parse(ALPHA + "    recrawl: {min: 1h, max: 30d}\n").get("alpha").recrawl_every_s == 2_592_000.0


def test_recrawl_settings_default_from_the_defaults_block_and_survive_a_dump() -> None:
    text = ALPHA.replace("sources:\n", "defaults:\n  recrawl: {min: 1h, max: 7d, closed_weight: 0.1}\nsources:\n")
    spec = parse(text).get("alpha")
    assert (spec.recrawl.min_s, spec.recrawl.max_s, spec.recrawl.closed_weight) == (3_600.0, 604_800.0, 0.1)
    assert SourceSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_a_spec_dumped_before_recrawl_existed_reads_as_its_fixed_cadence() -> None:
    dumped = parse(ALPHA).get("alpha").model_dump(mode="json")
    dumped.pop("recrawl")
    dumped["recrawl_every_s"] = 21_600.0  # as case packages kept their sources
    assert SourceSpec.model_validate(dumped).recrawl == RecrawlSpec.fixed(21_600.0)


@pytest.mark.parametrize(("seconds", "text"), [(2_592_000.0, "30d"), (3_600.0, "1h"), (900.0, "15m"), (90.0, "90s"),
                                               (5_400.0, "90m"), (1.5, "1.5s")])
def test_durations_read_back_as_the_file_writes_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text and parse_duration_s(text) == seconds


# -- what a source may reach on a private network ---------------------------------------------------


def test_a_source_allows_the_origin_of_its_url_only() -> None:
    allowance = parse(ALPHA).get("alpha").request.allowance
    assert allowance.origins == frozenset({("http", "127.0.0.1", 1)}) and allowance.networks == ()


def test_a_url_whose_host_is_filled_in_from_the_lead_allows_no_origin() -> None:
    text = ALPHA.replace(REQUEST_LINE, '    request: {url: "https://{value}/.well-known/security.txt"}\n')
    assert parse(text).get("alpha").request.allowance.origins == frozenset()


def test_private_networks_are_read_as_cidr_blocks() -> None:
    text = ALPHA.replace(REQUEST_LINE, REQUEST_LINE.replace('"}', '", private_networks: ["10.20.0.0/16", "fd00:1::/64"]}'))
    networks = parse(text).get("alpha").request.allowance.networks
    assert [str(n) for n in networks] == ["10.20.0.0/16", "fd00:1::/64"]


def test_a_private_network_that_is_not_a_cidr_block_fails_naming_the_key() -> None:
    text = ALPHA.replace(REQUEST_LINE, REQUEST_LINE.replace('"}', '", private_networks: ["10.20.0.1/16"]}'))
    message = spec_error(text)
    assert "source 'alpha': key 'request.private_networks'" in message and "not a CIDR block" in message


# -- secrets from the environment ---------------------------------------------------------------------


def test_every_value_from_the_environment_in_a_request_is_redacted_wherever_it_stands() -> None:
    from investigations.net.redaction import redact

    with_secrets = ('    request: {url: "${SPEC_BASE}/v1/${SPEC_PATH_KEY}/x?appid=${SPEC_APPID}&q={value}", '
                    'headers: {X-Whatever: "${SPEC_HEADER_KEY}"}}\n')
    env = {"SPEC_BASE": "https://base-not-secret.example", "SPEC_PATH_KEY": "path-key-5e1c9a",
           "SPEC_APPID": "appid-value-77f0", "SPEC_HEADER_KEY": "header-key-0b3d"}
    parse(ALPHA.replace(REQUEST_LINE, with_secrets), env=env)
    assert redact("path-key-5e1c9a appid-value-77f0 header-key-0b3d") == "*** *** ***"
    assert redact("https://base-not-secret.example/v1") == "https://base-not-secret.example/v1"  # where, not a key


def test_a_default_written_in_the_file_is_not_a_secret() -> None:
    from investigations.net.redaction import redact

    parse(ALPHA.replace("q={value}", "q={value}&limit=${SPEC_LIMIT:-limit-default-42}"))
    assert redact("limit-default-42") == "limit-default-42"
