"""The start-up benchmark's arithmetic, without running anything: the split, the goals, the report."""

import pytest

from testbed.bench import startup


def _summary(**over):
    s = {"workers": 8, "worker_processes": 8, "status": "completed", "first_update_after_launch_s": 10.0,
         "startup_ray_s": 4.0, "startup_actors_s": 4.0, "startup_first_update_s": 0.5}
    return {**s, **over}


def test_the_split_of_the_first_update_adds_up_and_per_process_counts_processes_not_workers():
    run = startup.derive("synthetic:64", _summary(workers=64), wall=30.0, memory=64 * 2**20, stderr="")
    assert run["session_s"] == pytest.approx(10.0 - 4.0 - 4.0 - 0.5)
    assert run["per_process_s"] == pytest.approx(0.5) and run["processes"] == 8
    assert run["memory_per_worker_bytes"] == 2**20 and run["stderr_lines"] == 0


def test_a_part_the_run_did_not_measure_leaves_the_session_unknown_not_zero():
    run = startup.derive("default", _summary(startup_ray_s=None), wall=12.0, memory=None, stderr="a\nb\n")
    assert run["session_s"] is None and run["memory_per_worker_bytes"] is None and run["stderr_lines"] == 2


def test_goals_take_the_median_of_the_repeats_and_say_missed():
    runs = [startup.derive("default", _summary(first_update_after_launch_s=t), wall=w, memory=0, stderr="")
            for t, w in ((9.0, 20.0), (12.0, 30.0), (9.5, 21.0))]
    got = {g["figure"]: g for g in startup.goals(runs)}
    assert set(got) == {"first_update_after_launch_s", "wall_s"}  # no synthetic:64 run, no goal for it
    assert got["first_update_after_launch_s"]["value"] == 9.5 and got["first_update_after_launch_s"]["met"]
    assert got["wall_s"]["value"] == 21.0 and got["wall_s"]["met"]
    slow = [startup.derive("default", _summary(first_update_after_launch_s=11.0), wall=26.0, memory=0, stderr="")]
    text = startup.report({"cores": 2, "python_loop_s": 0.2, "busy_before": 0.0, "runs": slow,
                           "errors": [{"case": "default", "repeat": 1, "error": "the default run exited 1: x"}],
                           "goals": startup.goals(slow)})
    assert text.count("MISSED") == 2 and "error default #2: the default run exited 1: x" in text


def test_the_cases_are_the_readme_command_and_synthetic_rings():
    assert startup.case_argv("default", 20) == ["--strategy", "ring", "--workers", "8"]
    assert startup.case_argv("synthetic:64", 20) == ["--strategy", "ring", "--workload", "synthetic",
                                                     "--workers", "64", "--steps", "20"]



def test_a_run_the_hypervisor_slowed_is_named_with_its_share():
    runs = [{**startup.derive("default", _summary(), wall=12.0, memory=0, stderr=""), "repeat": i, "steal": st}
            for i, st in enumerate((0.0, 0.25, None))]
    text = startup.report({"cores": 2, "python_loop_s": 0.2, "busy_before": None, "runs": runs, "errors": [],
                           "goals": startup.goals(runs)})
    assert "1 run(s) lost over 5% of the cores" in text and "up to 25%, default #2" in text
    quiet = startup.report({"cores": 2, "python_loop_s": 0.2, "busy_before": None, "runs": runs[:1],
                            "errors": [], "goals": []})
    assert "lost over" not in quiet
