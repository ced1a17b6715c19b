"""Which rank this process is, when the process group appears after the Monitor
(docs/python.md "Ranks").

Under ``mp.spawn`` a Monitor is often made before ``init_process_group``: nothing then
says which rank the process is (no RANK variable, no process group), and every process
would report rank 0 of 1. So the agent is created with ``identity_pending`` (it sends
nothing, not even its Hello, until told) and the rank is read again:

- at the first forward hook and at every ``step()`` until torch.distributed is
  initialised; the process group's rank and world size then apply from that moment on
  (``Agent.set_identity``), and the Hello says them;
- a first ``step()`` or ``flush()`` with no process group lets the agent go on as it
  was resolved (rank 0 of 1, or RANK / WORLD_SIZE); a process group that appears later
  still moves the agent to its rank, from then on, with a warning.

A rank given explicitly (``rank=`` or ``LOCKSTEP_RANK``) is kept; when the process group
says otherwise, a RuntimeWarning says so once. ``rank=-1`` means not distributed: never
re-read. Training thread and hooks, under the GIL.
"""
import os

import torch


def _dist():
    d = getattr(torch, "distributed", None)
    try:
        return d if d is not None and d.is_available() else None
    except Exception:  # pylint: disable=broad-except
        return None


def _given(arg, env_name):
    """The argument, else the environment variable's value, else None."""
    if arg is not None:
        return arg
    raw = os.environ.get(env_name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class Identity:
    """The rank and world size this Monitor sends under, and whether they may change."""

    def __init__(self, rank_arg, world_arg, cfg):
        self.rank, self.world = cfg["rank"], cfg["world_size"]
        given_rank = _given(rank_arg, "LOCKSTEP_RANK")
        self.explicit_rank = given_rank is not None
        self.explicit_world = _given(world_arg, "LOCKSTEP_WORLD_SIZE") is not None
        d = _dist()
        initialized = d is not None and d.is_initialized()
        # open: the process group may still appear and say something new.
        self.open = d is not None and not initialized and given_rank != -1
        # pending: nothing at all says which rank this is yet; the agent holds its Hello.
        self.pending = (self.open and not self.explicit_rank
                        and os.environ.get("RANK", "") == "")

    def check(self, agent, warn, at_step):
        """Reads torch.distributed again (once initialised, for the last time).
        ``warn(message)`` says what went wrong; never raises."""
        d = _dist()
        if d is None or not d.is_initialized():
            return
        self.open = False
        try:
            rank, world = int(d.get_rank()), int(d.get_world_size())
        except Exception as e:  # pylint: disable=broad-except
            warn("could not read this process's rank from torch.distributed (%s: %s); it "
                 "stays rank %d of %d (pass rank= and world_size= to the Monitor)"
                 % (type(e).__name__, e, self.rank, self.world))
            self.release(agent)
            return
        new_rank = self.rank if self.explicit_rank else rank
        new_world = self.world if self.explicit_world else world
        if (self.explicit_rank and rank != self.rank) or (self.explicit_world
                                                         and world != self.world):
            warn("rank=%d, world_size=%d were given to the Monitor but torch.distributed says "
                 "this process is rank %d of %d; lockstep keeps the given values (leave rank= "
                 "and world_size= out to use the process group's)"
                 % (self.rank, self.world, rank, world))
        if not 0 <= new_rank < new_world:
            warn("torch.distributed's rank %d is not below world_size %d; this Monitor stays "
                 "rank %d of %d" % (new_rank, new_world, self.rank, self.world))
            self.release(agent)
            return
        if (new_rank, new_world) == (self.rank, self.world):
            self.release(agent)
            return
        if not self.pending and new_rank != self.rank:
            warn("torch.distributed was initialised after this Monitor had sent data as rank "
                 "%d; from step %d on it sends as rank %d of %d (create the Monitor after "
                 "init_process_group, or pass rank=)" % (self.rank, at_step, new_rank, new_world))
        if agent.set_identity(new_rank, new_world):
            self.rank, self.world = new_rank, new_world
        else:
            warn("could not move this Monitor to rank %d of %d (the agent refused it); it "
                 "stays rank %d of %d" % (new_rank, new_world, self.rank, self.world))
        self.pending = False

    def release(self, agent):
        """No process group (yet): the agent goes on under the identity it has."""
        if self.pending:
            self.pending = False
            agent.set_identity(self.rank, self.world)
