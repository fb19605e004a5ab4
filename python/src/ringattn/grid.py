"""Two-dimensional context parallelism: a Grid of comms (ringattn.h's ulysses_size,
ringattn_plan_create_2d), usable wherever a Comm goes."""
import weakref

from . import _capi as C
from .core import Comm


class Grid:
    """Two-dimensional context parallelism (ringattn.h's ulysses_size): P = P_u x P_r ranks in
    P_r groups of P_u. Inside a group an all-to-all trades the sequence for the heads (Ulysses:
    each rank attends H / P_u query heads over its group's tokens); across the groups the ring
    runs, between the ranks at the same place in every group. Pass it wherever a Comm goes
    (Plan's comm=, ringattn.torch's comm=, ringattn.hf.ring): plans made over it are 2D plans.

    - Grid(group_comm, ring_comm): over two comms of the caller's (ringattn_plan_create_2d):
      group_comm the P_u ranks of this rank's group, ring_comm the P_r ranks at its place in
      every group (rank g of ring_comm is group g). The grid's rank is ring_comm.rank * P_u +
      group_comm.rank. The only way over torch.distributed (the library cannot split a custom
      transport's comm): ringattn.flash_attn's group=(ulysses_group, ring_group) or a 2-D
      DeviceMesh make one.
    - Grid.split(comm, ulysses_size, strided=False), or comm.grid(ulysses_size): one comm the
      library splits itself (threads, MPI): groups of P_u consecutive ranks, or strided ones
      (group g: ranks g, g + P / P_u, ...). rank is the comm's rank.

    Which tokens a rank holds (ringattn_plan_local_tokens; ringattn.torch.plan gives them): the
    layout splits each sequence among the P_r groups as a ring of P_r ranks would, and a group's
    tokens (all its sequences' pieces, in order) are split among its P_u ranks in consecutive
    pieces. Needs H % P_u == 0 and H_kv % P_u == 0 or P_u % H_kv == 0; no KV cache plans.
    """

    def __init__(self, group_comm, ring_comm, owned=False):
        for name, c in (("group_comm", group_comm), ("ring_comm", ring_comm)):
            if not isinstance(c, Comm):
                raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn.Grid: %s must be a "
                                             "ringattn.Comm, got %r" % (name, c))
        self.group, self.ring, self.comm, self.strided = group_comm, ring_comm, None, False
        self.ulysses_size, self.ring_size = group_comm.size, ring_comm.size
        self.rank = ring_comm.rank * group_comm.size + group_comm.rank
        self._owned = (group_comm, ring_comm) if owned else ()  # closed with the grid
        self._register()

    @staticmethod
    def split(comm, ulysses_size, strided=False):
        """A grid over one comm that the library splits (class docstring). Not collective: the
        split happens at each plan's creation."""
        if not isinstance(comm, Comm):
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn.Grid.split: comm must be "
                                         "a ringattn.Comm, got %r" % (comm,))
        pu = int(ulysses_size)
        if pu < 1 or comm.size % pu:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn.Grid.split: ulysses_size "
                                         "%d does not divide the comm's %d ranks" % (pu, comm.size))
        self = Grid.__new__(Grid)
        self.group = self.ring = None
        self.comm, self.strided = comm, bool(strided)
        self.ulysses_size, self.ring_size = pu, comm.size // pu
        self.rank, self._owned = comm.rank, ()
        self._register()
        return self

    def _register(self):
        self.size = self.ulysses_size * self.ring_size
        self._plans = weakref.WeakSet()
        self.id = next(Comm._ids)  # torch ops name a grid by its id, as a Comm
        Comm._registry[self.id] = self

    def comms(self):
        """The comms under the grid: (group_comm, ring_comm), or (comm,) for a split one."""
        return (self.comm,) if self.comm is not None else (self.group, self.ring)

    @property
    def _handle(self):  # live while every comm under it is
        return all(c._handle for c in self.comms())

    def close(self):
        """Destroys the plans made over the grid, and the comms it was made with owned=True."""
        for plan in list(self._plans):
            plan.close()
        for c in self._owned:
            c.close()

    def __repr__(self):
        return "ringattn.Grid(rank=%d, ulysses_size=%d, ring_size=%d%s)" % (
            self.rank, self.ulysses_size, self.ring_size, ", strided" if self.strided else "")


def _grid_of(comm, ulysses_size, strided):
    """The comm a plan is made over: comm, or comm.grid(ulysses_size) when one is asked for."""
    pu = int(ulysses_size or 0)
    if isinstance(comm, Grid):
        if pu not in (0, comm.ulysses_size) or (pu and bool(strided) != comm.strided):
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: ulysses_size=%d "
                                         "(strided %s) on a %r" % (pu, bool(strided), comm))
        return comm
    if pu > 1:  # (strided groups of one rank are no grid: a flat ring)
        if comm is None:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: ulysses_size=%d needs a "
                                         "comm to split into groups" % pu)
        if not isinstance(comm, Comm):
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: comm must be a "
                                         "ringattn.Comm or Grid, got %r" % (comm,))
        return comm.grid(pu, strided)
    return comm
