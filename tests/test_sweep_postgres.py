"""Two "machines" (two `python -m ctl.sweep` commands, each with its own --sweep_dir) on one study in a
real PostgreSQL server, started here (initdb into a temporary dir, 127.0.0.1 on a free port, removed
afterwards); the report of a sweep dir; and optuna-dashboard reading the study over HTTP.

PostgreSQL comes from the system's packages (`.ci/run` installs Debian's `postgresql` when missing);
the server refuses to run as root, so as root it runs as the `postgres` user.
"""

import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from ctl.launch import free_ports
from tests.support.env import ROOT, ctl_env
from tests.support.sweeps import DIGITS_GIN, TINY, write

# One test process for the module (xdist group): its server and the two machines' sweep (`machines`)
# start once, not once in each test process that takes one of its tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

BINARIES = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
SWEEP = """\
objective = "accuracy"
trials = 3
sampler = "tpe"
seed = 1
pruner = "asha"
study = "two_machines"
[space]
"DigitsTask.learning_rate" = { log_uniform = [1e-3, 3e-2] }
"DigitsTask.hidden_units" = { int_uniform = [16, 64] }
"""


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server on 127.0.0.1 (trust authentication, a database `sweep`); its URL."""
    if not BINARIES:
        pytest.fail("PostgreSQL is not installed: apt-get install postgresql (.ci/run does it).")
    bin_dir = os.path.dirname(BINARIES[-1])
    root = tempfile.mkdtemp(prefix="ctl-postgres-")
    as_user = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(root, "data"), free_ports(1)[0]
    subprocess.run([*as_user, f"{bin_dir}/initdb", "-D", data, "-U", "postgres", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    server = subprocess.Popen([*as_user, f"{bin_dir}/postgres", "-D", data, "-p", str(port),
                               "-k", root, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import psycopg

        def ready():
            try:
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                     autocommit=True, connect_timeout=2) as connection:
                    connection.execute("CREATE DATABASE sweep")
                return True
            except psycopg.OperationalError:
                assert server.poll() is None, "postgres exited"
                return False

        wait_for(ready, 60, "PostgreSQL to accept connections")
        yield f"postgresql://postgres@127.0.0.1:{port}/sweep"
    finally:
        server.terminate()  # Smart shutdown; then the files go.
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def machines(postgres, tmp_path_factory):
    root = tmp_path_factory.mktemp("machines")
    sweep_file = write(root / "pg.toml", SWEEP)
    dirs = [str(root / "machine_a"), str(root / "machine_b")]
    commands = [[sys.executable, "-m", "ctl.sweep", f"--gin_file={DIGITS_GIN}",
                 f"--sweep_file={sweep_file}", f"--sweep_dir={d}", f"--storage={postgres}", *TINY]
                for d in dirs]
    procs = [subprocess.Popen(c, cwd=ROOT, env=ctl_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    try:
        outputs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    return {"dirs": dirs, "outputs": outputs, "storage": postgres}


def test_two_machines_split_the_budget_without_overlap(machines):
    import optuna

    storage = optuna.storages.RDBStorage(machines["storage"].replace("postgresql://",
                                                                     "postgresql+psycopg://"))
    study = optuna.load_study(study_name="two_machines", storage=storage)
    assert study.metric_names == ["accuracy"]  # optuna-dashboard's label of the objective.
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2]
    assert all(t.state.name in ("COMPLETE", "PRUNED", "FAIL") for t in trials)
    ran = [set(os.listdir(os.path.join(d, "trials"))) for d in machines["dirs"]]
    assert not ran[0] & ran[1] and ran[0] | ran[1] == {"0", "1", "2"}, ran
    for trial in trials:  # Each ran where the study says it ran.
        assert os.path.isdir(trial.system_attrs["ctl_model_dir"])
    for trial in trials:  # Each run reported its evaluations to the study in PostgreSQL itself.
        if trial.state.name != "FAIL":
            assert 20 in trial.intermediate_values, (trial.number, trial.intermediate_values)
    assert all("3/3 ended" in out for out, _ in machines["outputs"])


def test_machines_that_open_a_new_database_at_once_all_open_it(postgres):
    """Optuna creates its tables in an empty database when a storage opens it; six machines
    (processes) that open a new one at the same moment each get the storage, none an error
    about a table or a key that another one has just made."""
    import psycopg

    server = postgres.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute("CREATE DATABASE at_once")
    start = time.time() + 15  # Past every process's imports: they open together.
    opener = ("import sys, time; from ctl.sweep import storage; "
              "time.sleep(max(0, float(sys.argv[1]) - time.time())); "
              "storage.open_storage('unused', sys.argv[2]); print('opened')")
    procs = [subprocess.Popen([sys.executable, "-c", opener, str(start), f"{server}/at_once"],
                              cwd=ROOT, env=ctl_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "opened" in out, err[-2000:]


def test_the_takeover_lock_is_held_by_one_connection_at_a_time(postgres, tmp_path):
    """ctl.sweep.optuna_internals.exclusive on PostgreSQL: an advisory lock through RDBStorage's
    engine; a second storage (another machine's connection) waits until the first lets go."""
    import threading

    import optuna

    from ctl.sweep import optuna_internals

    url = postgres.replace("postgresql://", "postgresql+psycopg://")
    storages = [optuna.storages.RDBStorage(url) for _ in range(2)]
    assert storages[0].engine.dialect.name == "postgresql"
    unused = str(tmp_path / "takeover.lock")  # A file lock would be this; none is made.
    inside, events = threading.Event(), []

    def second():
        inside.wait()
        with optuna_internals.exclusive(storages[1], "two_machines", unused):
            events.append("second in")

    thread = threading.Thread(target=second)
    thread.start()
    with optuna_internals.exclusive(storages[0], "two_machines", unused):
        inside.set()
        time.sleep(1)  # The second waits, however long this takes.
        events.append("first out")
    thread.join(timeout=60)
    assert events == ["first out", "second in"]
    assert not os.path.exists(unused)


def test_the_report_of_a_sweep_dir_sorts_the_trials_and_draws_them(machines):
    done = subprocess.run([sys.executable, "-m", "ctl.report", machines["dirs"][0]], cwd=ROOT,
                          env=ctl_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ctl report: sweep 'two_machines'") and "3 trials" in lines[0]
    header = lines[1].split()
    assert header[:3] == ["trial", "state", "accuracy"] and header[-2:] == ["steps", "time"]
    assert {"DigitsTask.hidden_units", "DigitsTask.learning_rate"} <= set(header)
    rows = [line.split() for line in lines[3:6]]
    complete = [float(r[2]) for r in rows if r[1] == "complete"]
    assert complete == sorted(complete, reverse=True) and complete
    png = os.path.join(machines["dirs"][0], "report.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_optuna_dashboard_reads_the_study(machines):
    port = free_ports(1)[0]
    url = machines["storage"].replace("postgresql://", "postgresql+psycopg://")
    dashboard = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "optuna-dashboard"),
                                  url, "--host", "127.0.0.1", "--port", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answer():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    return json.load(r)
            except OSError:
                assert dashboard.poll() is None, "optuna-dashboard exited"
                return None

        wait_for(lambda: answer() is not None, 60, "optuna-dashboard")
        studies = answer()["study_summaries"]
        assert [s["study_name"] for s in studies] == ["two_machines"]
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)

