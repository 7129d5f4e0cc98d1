"""What a results file says of the machine it was measured on (bench/driver.py): the processor, and
the speed of one core before and after the suite, which tells a noisy machine from a slow figure."""

from contentsvc.bench.driver import Run, machine_line


def test_a_run_records_the_processor_and_a_core_probe_at_both_ends():
    run = Run()
    run.finish()
    machine = run.machine
    assert machine["cpu_model"] is None or machine["cpu_model"].strip()
    for at in ("start", "end"):
        probe = machine[f"cpu_probe_ms_{at}"]
        assert len(probe) == 3 and all(ms > 0 for ms in probe)


def test_the_machine_line_gives_each_probes_spread():
    machine = {"nproc": 2, "cpu_model": "Example CPU", "python": "3.11.7", "loadavg_start": [0.5, 0.4, 0.3],
               "loadavg_end": [1.0, 0.5, 0.3], "cpu_probe_ms_start": [52.0, 58.5, 53.1],
               "cpu_probe_ms_end": [70.2, 61.0, 66.0]}
    assert machine_line(machine) == ("(2 cpu, Example CPU, python 3.11.7, loadavg [0.5, 0.4, 0.3] -> [1.0, 0.5, 0.3], "
                                     "core probe 52-58.5 -> 61-70.2 ms)")
    older = {k: v for k, v in machine.items() if not k.startswith("cpu_")}  # a results file from before the probe
    assert machine_line(older) == "(2 cpu, python 3.11.7, loadavg [0.5, 0.4, 0.3] -> [1.0, 0.5, 0.3])"
