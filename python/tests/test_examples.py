"""examples/python/train_step.py runs under torchrun and mpirun and matches one process."""
import os
import re
import shutil
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_step.py")
ARGS = ["--seqlens", "300,157", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--window",
        "100", "--steps", "2"]


def _run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1", RINGATTN_COMM_TIMEOUT="30")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    m = re.search(r"loss error ([0-9.e+-]+), gradient error ([0-9.e+-]+)", done.stdout)
    assert m, done.stdout
    assert float(m.group(1)) < 1e-5 and float(m.group(2)) < 1e-4, done.stdout
    assert done.stdout.count("step ") == 2


def test_train_step_under_torchrun():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _run([torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
          str(port), EXAMPLE] + ARGS)


def test_train_step_under_mpirun():
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is needed (cmake/install-deps.sh installs Open MPI)"
    _run([mpirun, "-n", "3", "--oversubscribe", "--allow-run-as-root", sys.executable, EXAMPLE,
          "--layout", "striped"] + ARGS)
