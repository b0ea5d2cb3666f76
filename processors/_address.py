"""Which addresses a fetch may connect to: IANA's special-purpose registries, IPv4 inside IPv6.

An IPv6 address that carries an IPv4 address (IPv4-mapped, IPv4-compatible, SIIT,
NAT64, 6to4, Teredo) reaches that IPv4 host through a translator or tunnel, so it is
judged by the IPv4 address it carries as well as by its own prefix: ``64:ff9b::7f00:1``
is loopback. The tables are Lamina's own (not ``ipaddress.is_global``, whose answers
change between Python versions) and err on refusing: IPv6 is public only inside
2000::/3, outside every special-purpose block.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import attrs

__all__ = ["AddressClass", "classify_address", "is_public_address"]

_V4 = tuple(
    (IPv4Network(net), kind)
    for net, kind in (
        ("0.0.0.0/8", "unspecified"),  # "this network"
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared"),  # carrier-grade NAT
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),  # cloud metadata lives at 169.254.169.254
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),  # IETF protocol assignments
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "reserved"),  # deprecated 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # includes 255.255.255.255, limited broadcast
    )
)

_V6 = tuple(
    (IPv6Network(net), kind)
    for net, kind in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("100::/64", "reserved"),  # discard-only
        ("100:0:0:1::/64", "reserved"),  # dummy prefix
        ("2001::/23", "reserved"),  # IETF protocol assignments (Teredo is unwrapped first)
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "reserved"),  # SRv6 SIDs
        ("fc00::/7", "private"),  # unique local
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),  # deprecated site-local
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST = IPv6Network("2000::/3")

# IPv6 forms that carry an IPv4 address, and whether the prefix itself may be public.
_MAPPED = IPv6Network("::ffff:0:0/96")
_TRANSLATED = IPv6Network("::ffff:0:0:0/96")  # SIIT
_COMPATIBLE = IPv6Network("::/96")  # deprecated IPv4-compatible
_NAT64 = IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")  # local-use NAT64, never globally reachable
_SIXTOFOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")


@attrs.frozen
class AddressClass:
    """What an address is: ``kind`` is public, loopback, private, link-local, shared,
    multicast, reserved, documentation, benchmarking or unspecified; ``via`` names the
    IPv6 form an IPv4 address was found in (mapped, nat64, 6to4, teredo, ...)."""

    kind: str
    via: str | None = None
    embedded: IPv4Address | None = None

    @property
    def public(self) -> bool:
        return self.kind == "public"


def _v4_kind(ip: IPv4Address) -> str:
    for net, kind in _V4:
        if ip in net:
            return kind
    return "public"


def _embedded(ip: IPv6Address) -> tuple[str, list[IPv4Address], bool] | None:
    """(form, the IPv4 addresses it carries, whether the form may be public at all)."""
    value = int(ip)
    low32 = IPv4Address(value & 0xFFFFFFFF)
    if ip in _MAPPED:
        return "ipv4-mapped", [low32], True
    if ip in _TRANSLATED:
        return "ipv4-translated", [low32], True
    if ip in _COMPATIBLE and value > 1:  # :: and ::1 are their own entries
        return "ipv4-compatible", [low32], True
    if ip in _NAT64:
        return "nat64", [low32], True
    if ip in _NAT64_LOCAL:
        # RFC 6052 /48 layout: IPv4 in bits 48-63 and 72-87 (bits 64-71 are the "u" octet).
        high = (value >> 64) & 0xFFFF
        low = (value >> 40) & 0xFFFF
        return "nat64-local", [IPv4Address(high << 16 | low)], False
    if ip in _SIXTOFOUR:
        return "6to4", [IPv4Address((value >> 80) & 0xFFFFFFFF)], True
    if ip in _TEREDO:
        server = IPv4Address((value >> 64) & 0xFFFFFFFF)
        client = IPv4Address(~value & 0xFFFFFFFF)  # stored with every bit flipped
        return "teredo", [client, server], True
    return None


def classify_address(address: str | IPv4Address | IPv6Address) -> AddressClass:
    """The address's special-purpose kind, looking through IPv6 forms that carry IPv4."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, IPv4Address):
        return AddressClass(_v4_kind(ip))
    ip = IPv6Address(int(ip))  # drop a scope id
    found = _embedded(ip)
    if found is not None:
        via, carried, may_be_public = found
        for v4 in carried:
            kind = _v4_kind(v4)
            if kind != "public":
                return AddressClass(kind, via, v4)
        return AddressClass("public" if may_be_public else "private", via, carried[0])
    for net, kind in _V6:
        if ip in net:
            return AddressClass(kind)
    return AddressClass("public" if ip in _GLOBAL_UNICAST else "reserved")


def is_public_address(address: str | IPv4Address | IPv6Address) -> bool:
    """Whether a fetch may connect to ``address`` without ``allow_private_network``."""
    return classify_address(address).public
