"""The daemon's network variables: the DNS upstreams and the allowlist entries' lifetime, checked."""

from __future__ import annotations

import pytest

from vz_core.daemon._network import dns_options
from vz_core.errors import InvalidArgumentError
from vz_core.network import DEFAULT_POOL
from vz_core.network._egress import pool_network


def test_dns_options_from_the_environment() -> None:
    assert dns_options({}) == {}
    got = dns_options(
        {
            "VZ_NETWORK_DNS_UPSTREAMS": "127.0.0.1:5353, 192.0.2.53",
            "VZ_NETWORK_DNS_MIN_TTL": "5",
            "VZ_NETWORK_DNS_MAX_TTL": "60",
        }
    )
    assert got == {"upstreams": [("127.0.0.1", 5353), ("192.0.2.53", 53)], "min_ttl": 5, "max_ttl": 60}


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({"VZ_NETWORK_DNS_UPSTREAMS": "resolver.example:53"}, "VZ_NETWORK_DNS_UPSTREAMS: 'resolver.example:53'"),
        ({"VZ_NETWORK_DNS_UPSTREAMS": "127.0.0.1:0"}, "no valid port"),
        ({"VZ_NETWORK_DNS_UPSTREAMS": "127.0.0.1:x"}, "not an IPv4 address"),
        ({"VZ_NETWORK_DNS_MIN_TTL": "-1"}, "VZ_NETWORK_DNS_MIN_TTL"),
        ({"VZ_NETWORK_DNS_MAX_TTL": "0"}, "VZ_NETWORK_DNS_MAX_TTL"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(environ: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        dns_options(environ)


def test_uplink_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VZ_NETWORK_UPLINK_POOL", raising=False)
    assert str(pool_network(None)) == DEFAULT_POOL
    monkeypatch.setenv("VZ_NETWORK_UPLINK_POOL", "172.30.0.0/24")
    assert str(pool_network(None)) == "172.30.0.0/24"
    assert str(pool_network("10.123.0.0/20")) == "10.123.0.0/20"
    for bad in ("8.8.8.0/24", "10.0.0.0/31", "127.0.0.0/24", "169.254.0.0/16", "nonsense"):
        with pytest.raises(InvalidArgumentError, match="VZ_NETWORK_UPLINK_POOL"):
            pool_network(bad)


def test_a_bad_value_stops_the_daemons_network_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vz_core.daemon._network import DaemonNetwork

    monkeypatch.setenv("VZ_NETWORK_DNS_UPSTREAMS", "resolver.example")
    with pytest.raises(InvalidArgumentError, match="VZ_NETWORK_DNS_UPSTREAMS"):
        DaemonNetwork()
    monkeypatch.setenv("VZ_NETWORK_DNS_UPSTREAMS", "127.0.0.1:5353")
    host = DaemonNetwork().host  # the NetworkHost it makes forwards there (nothing is started)
    assert host._dns_options["upstreams"] == [("127.0.0.1", 5353)]
