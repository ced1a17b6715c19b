"""host_stats_thread="auto": is the host statistics thread faster for this job, here?

It should be when a core is idle, but on some machines the training thread slows down
while another core reads the tensors it has just written (measured on 2-vCPU VMs: in
some hours the thread took a CPU step from 1.047 to 1.085 of its unwatched time, where
computing inline gave 1.06). So "auto" measures: after two warm-up steps, eight pairs
of watched steps, one with the thread and one inline in random order, each timed from
its first record to Monitor.step(); the thread stays only if the median of the per-pair
time ratios says it is faster by more than 0.5 %. Pairs cancel slow drift (data,
learning-rate phases). It measures again every 2000 watched steps, since the answer can
change with the machine's load.
"""
import random
import statistics


class ThreadTuner:
    WARMUP = 2       # watched steps not measured: first records are computed inline
    PAIRS = 8
    RETUNE = 2000    # watched steps between two measurements
    MARGIN = 0.995   # the thread must make steps at least this much shorter

    def __init__(self, seed=0x15):
        self._rng = random.Random(seed)
        self.use_thread = True
        self.ratio = None      # the last measurement: median time with / without thread
        self.decisions = 0
        self._skip = self.WARMUP
        self._plan = []        # modes of the coming measured steps
        self._pair = []
        self._ratios = []
        self._since = 0
        self._start()

    def _start(self):
        self._plan, self._pair, self._ratios = [], [], []
        for _ in range(self.PAIRS):
            first = self._rng.random() < 0.5
            self._plan += [first, not first]

    def next_mode(self):
        """Whether the next watched step uses the thread."""
        if self._skip > 0:
            return True
        if self._plan:
            return self._plan[0]
        return self.use_thread

    def add(self, threaded, seconds):
        """One watched step: whether it used the thread, and its time."""
        if self._skip > 0:
            self._skip -= 1
            return
        if not self._plan:
            self._since += 1
            if self._since >= self.RETUNE:
                self._start()
            return
        if threaded != self._plan[0]:  # not the step planned (the thread failed, say)
            return
        self._plan.pop(0)
        self._pair.append((threaded, seconds))
        if len(self._pair) == 2:
            (m1, s1), (m2, s2) = self._pair
            self._pair = []
            if m1 != m2 and s1 > 0 and s2 > 0:
                on, off = (s1, s2) if m1 else (s2, s1)
                self._ratios.append(on / off)
        if not self._plan:
            self.ratio = statistics.median(self._ratios) if self._ratios else None
            self.use_thread = self.ratio is not None and self.ratio < self.MARGIN
            self.decisions += 1
            self._since = 0
