"""The pool -> shard map as versioned data: adopting a durable record over the file, learning
newer placements from refusals (and never older or made-up ones), the configuration it yields."""

from __future__ import annotations

import pytest
from cronoq.cluster.topology import POOL_KEY, SHARD_KEY, VERSION_KEY, Placement, Topology, stale_placement
from cronoq.config import Config

FILE = """
[[pools]]
name = "default"
[[pools]]
name = "p2"
[[pools]]
name = "p3"

[[shards]]
name = "s1"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:7001"

[[shards]]
name = "s2"
number = 2
pools = ["p2", "p3"]
endpoint = "http://127.0.0.1:7002"
"""


@pytest.fixture
def config() -> Config:
    return Config.parse(FILE, shard_override="s1")


def test_the_file_places_every_pool_at_the_first_version(config: Config) -> None:
    topology = Topology.from_config(config)
    assert topology.placements() == {
        "default": Placement("s1", 1),
        "p2": Placement("s2", 1),
        "p3": Placement("s2", 1),
    }
    assert topology.version == 1
    assert topology.record() == {"default": ("s1", 1), "p2": ("s2", 1), "p3": ("s2", 1)}


def test_the_durable_record_wins_and_each_difference_is_named(config: Config) -> None:
    record = {"default": ("s1", 1), "p2": ("s1", 3), "p3": ("s2", 2), "gone": ("s2", 4), "p9": ("s9", 5)}
    topology, notes = Topology.adopt(config, record)
    assert topology.placement("p2") == Placement("s1", 3)
    assert topology.placement("p3") == Placement("s2", 2)  # same shard, later version: no difference
    assert topology.version == 3
    assert notes == [
        "pool 'gone': the durable record (version 4) places it on shard 's2', but the file has no such pool; ignored",
        "pool 'p2': the file places it on shard 's2', the durable record (version 3) on shard 's1'; the record wins",
        "pool 'p9': the durable record (version 5) places it on shard 's9', but the file has no such pool; ignored",
    ]


def test_a_record_naming_a_shard_the_file_lacks_is_reported_and_the_file_kept(config: Config) -> None:
    topology, notes = Topology.adopt(config, {"default": ("s7", 2)})
    assert topology.placement("default") == Placement("s1", 1)
    assert notes == [
        "pool 'default': the durable record (version 2) places it on shard 's7', which the file does not define; "
        "the file's shard 's1' is used"
    ]


def test_the_configuration_is_rebuilt_with_the_record_s_pools(config: Config) -> None:
    topology, _ = Topology.adopt(config, {"p2": ("s1", 2)})
    placed = topology.apply(config)
    assert placed.shard("s1").pools == ("default", "p2")
    assert placed.shard("s2").pools == ("p3",)
    assert [pool.name for pool in placed.local_pools()] == ["default", "p2"]
    assert placed.shard_of_pool("p2") is not None and placed.shard_of_pool("p2").name == "s1"  # type: ignore[union-attr]
    # The file's own configuration is left as it was.
    assert config.shard("s2").pools == ("p2", "p3")


def test_only_newer_placements_of_known_pools_on_known_shards_are_learned(config: Config) -> None:
    topology = Topology.from_config(config)
    assert topology.learn("p2", Placement("s1", 2))
    assert topology.placement("p2") == Placement("s1", 2)
    assert not topology.learn("p2", Placement("s2", 2))  # same version: the first one stays
    assert not topology.learn("p2", Placement("s2", 1))  # older
    assert not topology.learn("nope", Placement("s1", 9))  # unknown pool
    assert not topology.learn("p3", Placement("s9", 9))  # unknown shard
    assert topology.placement("p2") == Placement("s1", 2)
    copy = topology.copy()
    assert copy.learn("p2", Placement("s2", 3))
    assert topology.placement("p2") == Placement("s1", 2)  # copies learn on their own


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2", 2),
        ("0", None),
        ("-1", None),
        ("", None),
        ("1e3", None),
        ("٣", None),  # a digit, but not ASCII
        ("9" * 19, None),  # past the bound
        ("9" * 400, None),
        (" 2", None),
    ],
)
def test_a_refusal_s_version_is_bounded_before_use(version: str, expected: int | None) -> None:
    found = stale_placement([(SHARD_KEY, "s2"), (POOL_KEY, "p2"), (VERSION_KEY, version)])
    assert (None if found is None else found[1].version) == expected


def test_a_refusal_without_all_three_entries_is_not_a_stale_route() -> None:
    assert stale_placement([(SHARD_KEY, "s2"), ("cronoq-shard-endpoint", "http://x")]) is None
    assert stale_placement([(SHARD_KEY, "s2"), (POOL_KEY, "p2")]) is None
    assert stale_placement([(SHARD_KEY, "s2"), (POOL_KEY, "p2"), (VERSION_KEY, b"2")]) is None
    assert stale_placement([(SHARD_KEY, "s2"), (POOL_KEY, "p2"), (VERSION_KEY, "7")]) == ("p2", Placement("s2", 7))
