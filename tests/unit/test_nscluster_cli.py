"""The namespace cluster's command line refuses bad input in one line, exit 2, before it builds
anything (the cluster itself is tests/cluster)."""

import pytest

from testbed.nscluster.cli import main


@pytest.mark.parametrize(("argv", "needle"), [
    (["up", "--nodes", "0"], "--nodes 0: use 1..200"),
    (["--name", "Bad_Name", "down"], "--name 'Bad_Name'"),
    (["--name", "waytoolongname", "up"], "1-8 lower-case letters"),
    (["--name", "tbnone", "kill-node", "1"], "no cluster 'tbnone' is up"),
    (["--name", "tbnone", "env"], "no cluster 'tbnone' is up"),
    (["env", "--name", "tbnone"], "no cluster 'tbnone' is up"),  # the name after the command, too
    (["down", "--name", "Bad_Name"], "--name 'Bad_Name'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize("cpus", ["-1", "0", "1.5", "nan", "inf"])
def test_bad_cpus_are_refused_before_anything_is_built(cpus, capsys, monkeypatch, tmp_path):
    """Before: `up --cpus -1` built the namespaces and wrote the token folder, then Ray's
    `ray start` failed on the value and left the folder behind."""
    import testbed.nscluster.cli as nscluster

    def built(*_args, **_kw):
        raise AssertionError("up() ran: the value reached the cluster")

    monkeypatch.setattr(nscluster, "up", built)
    assert main(["--name", "tbcpus", "up", "--nodes", "2", "--cpus", cpus]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--cpus" in err and "use 1 or more" in err
