"""The private test dockerd's address pools: a block no host route overlaps, from 10.0.0.0/8 or
the next private range when the host routes into all of it; and the engine's words for pools
used up, in each Docker version's phrasing."""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Network

import pytest

from tests.infra import dockerd
from tests.infra.dockerd import NO_POOL, address_pool_base


def routed(monkeypatch: pytest.MonkeyPatch, *nets: str) -> list[IPv4Network]:
    """The host's routes are ``nets`` meanwhile."""
    routes = [ipaddress.IPv4Network(n) for n in nets]
    monkeypatch.setattr(dockerd, "_host_routes", lambda: routes)
    return routes


@pytest.mark.parametrize(
    ("routes", "expected_range"),
    [
        ((), "10.0.0.0/8"),
        (("10.0.0.0/9",), "10.128.0.0/9"),  # found however little of 10/8 is left
        (("10.0.0.0/8",), "172.16.0.0/12"),
        (("10.0.0.0/8", "172.16.0.0/12"), "192.168.0.0/16"),
        (("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"), "100.64.0.0/10"),
    ],
)
def test_a_block_no_route_overlaps_from_the_first_range_with_one(
    monkeypatch: pytest.MonkeyPatch, routes: tuple[str, ...], expected_range: str
) -> None:
    taken = routed(monkeypatch, *routes)
    for _ in range(20):  # random blocks: a few of them
        block = ipaddress.IPv4Network(address_pool_base())
        assert block.prefixlen == 21 and block.subnet_of(IPv4Network(expected_range)), block
        assert not any(block.overlaps(r) for r in taken), block


def test_the_last_free_block_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # All of 10/8 but one /21 (10.77.8.0/21): a random search would seldom hit it.
    free = IPv4Network("10.77.8.0/21")
    routed(monkeypatch, *map(str, IPv4Network("10.0.0.0/8").address_exclude(free)))
    assert address_pool_base() == str(free)


def test_as_many_pools_as_asked_rounded_up_to_a_power_of_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    routed(monkeypatch)
    assert IPv4Network(address_pool_base(1)).prefixlen == 24
    assert IPv4Network(address_pool_base(9)).prefixlen == 20  # 16 pools
    assert address_pool_base(256 * 256) == "10.0.0.0/8"


def test_more_pools_than_fit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    routed(monkeypatch)
    for pools in (0, 256 * 256 + 1):
        with pytest.raises(ValueError, match=rf"^{pools} address pools: give 1 to 65536 "):
            address_pool_base(pools)
    # 16384 pools (a /10): only 10/8 and 100.64/10 can hold them, and the host routes into both.
    routed(monkeypatch, "10.0.0.0/8", "100.100.0.0/16")
    with pytest.raises(RuntimeError, match=r"^no /10 for the test daemon's 16384 address") as e:
        address_pool_base(16384)
    assert str(e.value).endswith("every one of 10.0.0.0/8, 100.64.0.0/10 (/proc/net/route)")


@pytest.mark.parametrize(
    "message",
    [
        "could not find an available, non-overlapping IPv4 address pool among the defaults to"
        " assign to the network",
        "all predefined address pools have been fully subnetted",
    ],
)
def test_pools_used_up_in_either_phrasing(message: str) -> None:
    assert NO_POOL.search(f"403 Client Error: Forbidden ({message})")
    assert not NO_POOL.search("network with name x already exists")
