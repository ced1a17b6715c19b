"""lockstep: watch two training runs (e.g. GPU and NPU) and say when and where they
part ways. See docs/python.md.

    import lockstep
    lockstep.seed_all(1234)
    mon = lockstep.Monitor(run="npu-01", role="candidate", experiment="glm")
    mon.watch(model, optimizer=opt)
    ...  # training loop, calling mon.step(loss=loss, lr=lr) once per step
    mon.close()
"""
from lockstep._monitor import Monitor, NoOpMonitor
from lockstep._seed import seed_all

__version__ = "0.1.0"
__all__ = ["Monitor", "NoOpMonitor", "seed_all", "__version__"]
