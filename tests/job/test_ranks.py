"""Which rank ran where, and which never said it ended (launcher/job/ranks.py): how a stop names a lost node."""

from __future__ import annotations

from launcher.job import ranks
from launcher.job.train import stopped_message


def test_the_ranks_that_started_and_never_ended_are_named_by_node(tmp_path):
    for rank, node, host in ((0, 0, "node-a"), (1, 0, "node-a"), (2, 1, "node-b"), (3, 1, "node-b")):
        ranks.started(tmp_path, rank, node, host)
    assert ranks.lost_nodes(tmp_path) == "node 0 (node-a): ranks 0, 1; node 1 (node-b): ranks 2, 3"
    ranks.ended(tmp_path, 0, "returned 0")
    ranks.ended(tmp_path, 1, "raised RuntimeError")  # saw its peer's connection close
    ranks.ended(tmp_path, 3, "raised RuntimeError")
    assert [r["rank"] for r in ranks.lost(tmp_path)] == [2]  # SIGKILLed: it could not say so
    assert ranks.lost_nodes(tmp_path) == "node 1 (node-b): rank 2"
    hostfile_names = ["10.0.0.1", "10.0.0.2"]  # as the hostfile names them, beside the machines' own names
    assert ranks.lost_nodes(tmp_path, hostfile_names) == "node 1 (10.0.0.2, hostname node-b): rank 2"
    assert ranks.lost_nodes(tmp_path, ["node-a", "node-b"]) == "node 1 (node-b): rank 2"
    ranks.ended(tmp_path, 2, "returned 0")
    assert ranks.lost_nodes(tmp_path) is None
    ranks.clear(tmp_path)  # the next launch starts with no records
    assert ranks.lost(tmp_path) == [] and not (tmp_path / ranks.RANKS_DIR).exists()


def test_the_stop_message_names_the_lost_node(tmp_path):
    killed = stopped_message(tmp_path, 247, several_nodes=True, lost="node 1 (node-b): rank 2")
    assert killed.startswith("training stopped: a rank was killed on node 1 (node-b): rank 2 (started, never ended)")
    assert killed.endswith("the same command starts over (no complete checkpoint yet)")
    failed = stopped_message(tmp_path, 1, several_nodes=True)
    assert "on one of the nodes (the log's first error names it" in failed
    assert "node" not in stopped_message(tmp_path, 1)
