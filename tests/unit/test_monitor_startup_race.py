"""The master's monitor does not take a worker that start() registered but has not spawned yet for an exited one
(it would stop the whole server when a servable is loaded after every other was unloaded)."""

import threading

from mindspore_serving.master.worker_processes import WorkerPlan, WorkerProcess, WorkerProcesses


def test_a_worker_being_started_does_not_count_as_exited():
    exited = threading.Event()
    processes = WorkerProcesses("unix:unused", on_death=lambda worker: None, on_all_exited=exited.set)
    plan = WorkerPlan("/servables", "add", 1, None, 0, 0, None, "AES-GCM")
    worker = WorkerProcess(plan)  # as start() holds it between adding it and spawning its process
    processes.workers[plan.key] = worker
    processes.ensure_monitor()
    try:
        assert not exited.wait(0.3)  # several monitor rounds
        worker.starts = 1  # it did start, and its process is gone for good
        assert exited.wait(10)
    finally:
        processes.stop(grace=0)
