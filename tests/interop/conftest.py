"""Fixtures of the interop tests: real msprobe dumps (msprobe_dump.make_dump), each made
once per pytest session and shared by every test that asks for the same one."""
import pytest
import torch

torch.set_num_threads(1)

import msprobe_dump  # noqa: E402  (after set_num_threads)


@pytest.fixture(scope="session")
def msprobe_dumps(tmp_path_factory):
    """get(task, level, steps=2, ranks=1, **make_dump_kwargs) -> the dump's root folder;
    a dump already made with the same arguments is reused."""
    made = {}

    def get(task, level, steps=2, ranks=1, **kwargs):
        key = (task, level, steps, ranks, tuple(sorted(kwargs.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp("msprobe")
            made[key] = msprobe_dump.make_dump(folder, task, level, steps, ranks, **kwargs)
        return made[key]

    return get
