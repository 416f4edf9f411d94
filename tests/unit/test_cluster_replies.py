"""The ``CLUSTER NODES`` / ``CLUSTER INFO`` replies the embedded Redis Cluster waits on, parsed."""

from __future__ import annotations

from infra.embedded_cluster import ClusterNodeLine, parse_cluster_info, parse_cluster_nodes

NODES = """\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922 [10923->-292f]
292f 127.0.0.1:30003@40003 master,fail? - 1426238318243 1426238318243 3 disconnected 10923-16383
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [93-<-292f]
6ec2 [::1]:30005@40005,hostname handshake,noaddr - 0 0 0 connected
"""


def test_cluster_nodes_lines_are_parsed_migrations_left_out() -> None:
    lines = {line.node_id: line for line in parse_cluster_nodes(NODES)}
    assert lines["07c3"] == ClusterNodeLine(
        "07c3", 30004, frozenset({"slave"}), "e7d1", connected=True, slots=()
    )
    assert lines["67ed"].slots == ((5461, 10923),)
    assert lines["292f"].flags == {"master", "fail?"} and not lines["292f"].connected
    assert lines["e7d1"].slots == ((0, 5461), (7000, 7001))  # a single slot is [s, s+1)
    assert "myself" in lines["e7d1"].flags and lines["e7d1"].master_id == "-"
    assert lines["6ec2"].port == 30005 and lines["6ec2"].flags == {"handshake", "noaddr"}


def test_cluster_info_is_a_dict() -> None:
    info = parse_cluster_info("cluster_state:ok\r\ncluster_slots_ok:16384\r\n\r\n")
    assert info == {"cluster_state": "ok", "cluster_slots_ok": "16384"}
