"""The ring tests' ranks: threads of this process on ringattn.Comm.threads, or worker processes
of one torch.distributed job on this machine (gloo over localhost: RANK, WORLD_SIZE,
MASTER_ADDR/PORT set, this folder on PYTHONPATH, one OpenMP thread each on 2 shared cores)."""
import os
import socket
import subprocess
import sys
import threading

import ringattn
import ringattn.torch as rt

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes(worker, args, ranks, comm_timeout=60, timeout=300):
    """Runs `python <HERE>/<worker> *args` as ranks 0..ranks-1; fails with every rank's output
    unless all exit 0 within `timeout` seconds. Returns the outputs."""
    env = dict(os.environ, RINGATTN_COMM_TIMEOUT=str(comm_timeout), OMP_NUM_THREADS="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, worker)] + [str(a) for a in args],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(ranks)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0])
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return logs


def threads(body, ranks, timeout=120):
    """body(comm, rank) for each rank on a thread of its own, over Comm.threads(ranks); the
    results in rank order. A rank's exception is raised here, after every rank ended; the plans
    and comms are released either way."""
    comms = ringattn.Comm.threads(ranks)
    results, errors = [None] * ranks, []

    def rank(r):
        try:
            results[r] = body(comms[r], r)
        except BaseException as exc:  # re-raised by the calling thread
            errors.append(exc)

    workers = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout)
    assert not any(t.is_alive() for t in workers), "a rank hung"
    rt.clear_cache()
    for c in comms:
        c.close()
    if errors:
        raise errors[0]
    return results
