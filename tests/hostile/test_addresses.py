"""The address classifier against IANA's special-purpose registries and every IPv6 form
that carries an IPv4 address; a host resolving to a refused one is never fetched."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lamina.processors._address import classify_address, is_public_address

IPV4_REGISTRY = [
    ("0.0.0.0", "unspecified"),
    ("0.255.255.255", "unspecified"),
    ("10.0.0.1", "private"),
    ("100.64.0.1", "shared"),
    ("100.127.255.254", "shared"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("169.254.0.1", "link-local"),
    ("169.254.169.254", "link-local"),  # cloud metadata
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.8", "reserved"),
    ("192.0.0.170", "reserved"),  # NAT64 discovery
    ("192.0.2.1", "documentation"),
    ("192.88.99.1", "reserved"),
    ("192.168.1.1", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("8.8.8.8", "public"),
    ("1.1.1.1", "public"),
    ("172.32.0.1", "public"),
    ("100.128.0.1", "public"),
    ("169.255.0.1", "public"),
]

IPV6_REGISTRY = [
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("100::1", "reserved"),
    ("100:0:0:1::1", "reserved"),
    ("2001:2::1", "reserved"),
    ("2001:10::1", "reserved"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("5f00::1", "reserved"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("fec0::1", "private"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("4000::1", "reserved"),  # outside global unicast 2000::/3
    ("2606:4700:4700::1111", "public"),
    ("2a00:1450::1", "public"),
]

# IPv4 targets, each to be written in every IPv6 form that carries an IPv4 address.
TARGETS = [
    ("127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"),
    ("10.1.2.3", "private"),
    ("192.168.0.1", "private"),
    ("100.64.0.1", "shared"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("8.8.8.8", "public"),
]


def _int(v4: str) -> int:
    return int(ipaddress.IPv4Address(v4))


def _forms(v4: str) -> dict[str, str]:
    n = _int(v4)
    teredo = (0x2001 << 112) | (_int("65.54.227.120") << 64) | (0x8000 << 48) | (0xFFFF ^ 0)
    teredo = (teredo & ~0xFFFFFFFF) | (n ^ 0xFFFFFFFF)
    nat64_local = (0x0064FF9B0001 << 80) | ((n >> 16) << 64) | ((n & 0xFFFF) << 40)
    return {
        "ipv4-mapped": f"::ffff:{v4}",
        "ipv4-translated": f"::ffff:0:{v4}",
        "nat64": f"64:ff9b::{v4}",
        "6to4": str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1)),
        "teredo": str(ipaddress.IPv6Address(teredo)),
        "nat64-local": str(ipaddress.IPv6Address(nat64_local)),
        **({"ipv4-compatible": f"::{v4}"} if n > 1 else {}),
    }


@pytest.mark.parametrize(("address", "kind"), IPV4_REGISTRY + IPV6_REGISTRY)
def test_special_purpose_registry_entries(address: str, kind: str) -> None:
    found = classify_address(address)
    assert (found.kind, found.via) == (kind, None)
    assert is_public_address(address) == (kind == "public")


@pytest.mark.parametrize(("v4", "kind"), TARGETS)
def test_every_ipv4_carrying_form_is_judged_by_its_ipv4(v4: str, kind: str) -> None:
    forms = _forms(v4)
    assert len(forms) >= 6
    for via, address in forms.items():
        found = classify_address(address)
        assert found.via == via, address
        assert str(found.embedded) == v4, address
        # Local-use NAT64 is never globally reachable, whatever it carries.
        expected = "private" if via == "nat64-local" and kind == "public" else kind
        assert found.kind == expected, (address, found)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b:1::7f00:1", "unspecified"),  # local-use: refused whatever it carries
        ("2002:7f00:1::", "loopback"),
        ("2002:a9fe:a9fe::", "link-local"),
        ("::7f00:1", "loopback"),
    ],
)
def test_the_issues_bypass_addresses_are_refused(address: str, kind: str) -> None:
    assert classify_address(address).kind == kind
    assert not is_public_address(address)


def test_teredo_with_a_private_server_is_refused() -> None:
    address = (0x2001 << 112) | (_int("10.0.0.1") << 64) | (_int("8.8.8.8") ^ 0xFFFFFFFF)
    found = classify_address(ipaddress.IPv6Address(address))
    assert (found.kind, found.via, str(found.embedded)) == ("private", "teredo", "10.0.0.1")


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_nat64_and_mapped_forms_agree_with_the_ipv4_address(n: int) -> None:
    v4 = ipaddress.IPv4Address(n)
    public = is_public_address(v4)
    assert is_public_address(ipaddress.IPv6Address((0x64FF9B << 96) | n)) == public
    assert is_public_address(ipaddress.IPv6Address((0xFFFF << 32) | n)) == public
    assert is_public_address(ipaddress.IPv6Address((0x2002 << 112) | (n << 80))) == public
